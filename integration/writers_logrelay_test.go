package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// recordingPublisher keeps what it is given, by message id.
type recordingPublisher struct {
	mu   sync.Mutex
	sent map[string]*message.Message
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.sent[m.UUID] = m
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) get(id string) *message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[id]
}

// An event a writer in another language commits through publish() is relayed by the log relay as
// well as by the polling relay, in both of its modes: in WAL mode the Go writers emit to the log,
// and a row in the table is read from the log all the same.
func TestWriters_PublishedRowsThroughTheLogRelay(t *testing.T) {
	for _, mode := range []pglog.Mode{pglog.ModeTable, pglog.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			pub := &recordingPublisher{sent: map[string]*message.Message{}}
			f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: pub, Name: "writers"})
			if err != nil {
				t.Fatal(err)
			}
			relay, err := pglog.New(pglog.Config{Forwarder: f, Pool: pg.Pool, Mode: mode, FlushInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil && ctx.Err() == nil {
					t.Errorf("log relay: %v", err)
				}
				cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer ccancel()
				testenv.Eventually(t, 10*time.Second, "slot "+relay.SlotName()+" to be dropped", func() bool {
					_, err := pg.Pool.Exec(cctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, relay.SlotName())
					return err == nil
				})
				_, _ = pg.Pool.Exec(cctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{relay.SlotName()}.Sanitize())
			})
			select {
			case <-relay.Reading():
			case err := <-done:
				t.Fatalf("the log relay ended before reading its slot: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the log relay did not read its slot within 30s")
			}

			var id string
			if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(
				`SELECT {{schema}}.publish('orders', 'OrderPlaced', 'order-7', '{"order_id": "order-7"}', '{"x_writer": "sql"}')`)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, "the log relay to publish the event", func() bool { return pub.get(id) != nil })
			m := pub.get(id)
			if outboxkit.EventType(m) != "OrderPlaced" || outboxkit.PartitionKey(m) != "order-7" || m.Metadata.Get("x_writer") != "sql" ||
				m.Metadata.Get(outboxkit.MetadataContentType) != "application/json" || string(m.Payload) != `{"order_id": "order-7"}` {
				t.Errorf("the log relay published %v %q", m.Metadata, m.Payload)
			}
		})
	}
}
