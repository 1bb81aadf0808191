package forwarder_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend" // memory://; import your broker's package
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// A relay moving a committed event from the outbox to the broker. Run does the same in a loop,
// woken by writers where the store can (Postgres NOTIFY, SQLite in-process); DispatchBatch is one
// pass, for tests and tools.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	// amqp://, kafka://, nats://, redis://: the same code, another URL (and package).
	broker, err := backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	sub, err := broker.NewSubscriber("shipping")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	received, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}

	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-1", map[string]string{"id": "o-1"})
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker.Publisher})
	if err != nil {
		log.Fatal(err)
	}
	res, err := relay.DispatchBatch(ctx) // in a service: go relay.Run(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", res.Published)
	m := <-received
	m.Ack()
	fmt.Println(m.UUID == msg.UUID, string(m.Payload))
	// Output:
	// published: 1
	// true {"id":"o-1"}
}

// memorySource is a Source that relays rows it was handed — where a real source reads a
// database's log — until each is published or dead-lettered, or ctx ends.
type memorySource struct{ rows []store.OutboxRow }

func (s *memorySource) Relay(ctx context.Context, r *forwarder.SourceRelay) error {
	for len(s.rows) > 0 {
		d := r.PublishRows(ctx, s.rows)
		// A real source records its position here, and d.Failed's dead letters.
		failed := map[int64]store.FailedRow{}
		for _, f := range d.Failed {
			failed[f.Seq] = f
		}
		left := s.rows[:0]
		for _, row := range s.rows {
			f, isFailed := failed[row.Seq]
			switch {
			case slices.Contains(d.Published, row.Seq), f.DeadLettered:
			case isFailed:
				row.Attempts++ // its failures so far: the next one backs off further
				left = append(left, row)
			default: // released: paused, behind its key's failure, or the broker unreachable
				left = append(left, row)
			}
		}
		s.rows = left
		if len(s.rows) == 0 {
			break
		}
		r.IdlePass()
		select {
		case <-ctx.Done():
			return nil
		case <-r.PausesChanged(): // a resume goes on at once
		case <-time.After(100 * time.Millisecond): // a backoff or the circuit's next probe
		}
	}
	return nil
}

// A relay of rows another source reads — the log relay of package forwarder/pglog reads them from
// Postgres's write-ahead log — run through the forwarder's publish path: per-key order, circuit,
// backoff, dead letters, pauses, heartbeat, metrics and tracing. The publisher is any Watermill
// one; here Watermill's in-process gochannel.
func ExampleForwarder_RunSource() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db")) // where the pauses and heartbeats are
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	// A publish returns once the subscriber acked: the broker confirmed it.
	broker := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer broker.Close()
	received, err := broker.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	go func() { // a consumer
		for m := range received {
			fmt.Println(m.UUID, string(m.Payload), m.Metadata.Get(outboxkit.MetadataPartitionKey))
			m.Ack()
		}
	}()

	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker})
	if err != nil {
		log.Fatal(err)
	}
	src := &memorySource{rows: []store.OutboxRow{
		{Seq: 1, UUID: "0193a1f0-0000-7000-8000-000000000001", Topic: "orders", PartitionKey: "o-1", Payload: []byte(`{"placed":"o-1"}`), Metadata: []byte(`{}`)},
		{Seq: 2, UUID: "0193a1f0-0000-7000-8000-000000000002", Topic: "orders", PartitionKey: "o-1", Payload: []byte(`{"paid":"o-1"}`), Metadata: []byte(`{}`)},
	}}
	if err := relay.RunSource(ctx, src); err != nil { // returns once every row went
		log.Fatal(err)
	}
	// Output:
	// 0193a1f0-0000-7000-8000-000000000001 {"placed":"o-1"} o-1
	// 0193a1f0-0000-7000-8000-000000000002 {"paid":"o-1"} o-1
}
