package storetest

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
)

// sqlWriter is the statement a writer outside Go runs in its transaction (docs/tables.md), with ?
// placeholders for (id, topic, event type, partition key, payload, metadata), and whether the
// database itself gives the envelope its event and content type and refuses bad input (Postgres's
// publish function and MySQL's procedure do; SQLite's writer runs a plain INSERT and writes them).
func sqlWriter(storeName string) (statement string, checks bool) {
	switch {
	case strings.HasPrefix(storeName, "postgres"):
		return `SELECT {{schema}}.publish(?, ?, ?, ?, ?, ?)`, true
	case strings.HasPrefix(storeName, "mysql"):
		return `CALL {{schema}}.publish(?, ?, ?, ?, ?, ?)`, true
	default:
		return `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, created_at)
VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z')`, false
	}
}

// writeSQL runs the store's SQL writer in a transaction of its own, committed unless rollback.
func writeSQL[TTx any](e *Env[TTx], id any, topic, eventType string, key any, payload string, metadata any, rollback bool) error {
	statement, checks := sqlWriter(e.Store.Info().Name)
	args := []any{topic, eventType, key, payload, metadata, id}
	if !checks {
		// The INSERT's own order; the writer puts the event type into the metadata itself.
		args = []any{id, topic, key, []byte(payload), metadata}
	}
	ctx := context.Background()
	tx, err := e.Begin(ctx)
	if err != nil {
		return err
	}
	if err := e.ExecTx(ctx, tx, statement, args...); err != nil || rollback {
		_ = e.Rollback(ctx, tx)
		return err
	}
	return e.Commit(ctx, tx)
}

// An event written by the SQL a writer in another language runs is relayed as the same event
// written by the Go writer: same id, topic, payload and metadata (the relay's created_at and seq
// aside). A rolled-back call leaves nothing; an id the database makes is a UUIDv7. Where the
// database checks the envelope, each kind of bad input is refused with a message that names it and
// nothing is written.
func sqlWriterMatchesGo[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	_, checks := sqlWriter(e.Store.Info().Name)
	const (
		payload     = `{"order_id":"o-1","total":42}`
		traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	)
	byGo, err := pipeline.NewJSONEvent("OrderPlaced", "o-1", json.RawMessage(payload))
	if err != nil {
		t.Fatal(err)
	}
	byGo.Metadata.Set("traceparent", traceparent)
	byGo.Metadata.Set("x_request", "r-1")
	outboxkit.SetTenant(byGo, "acme")
	outboxkit.SetVersion(byGo, 3)
	if err := publishIn(e, nil, "orders", byGo); err != nil {
		t.Fatal(err)
	}

	// The writer's own metadata: what a service in another language knows of the event.
	own := map[string]string{"traceparent": traceparent, "x_request": "r-1", outboxkit.MetadataTenant: "acme",
		outboxkit.MetadataVersion: "3"}
	if !checks {
		own[outboxkit.MetadataEventType] = "OrderPlaced"
		own[outboxkit.MetadataContentType] = "application/json"
	}
	ownJSON, _ := json.Marshal(own)
	sqlID := uuid.Must(uuid.NewV7()).String()
	if err := writeSQL(e, sqlID, "orders", "OrderPlaced", "o-2", payload, string(ownJSON), false); err != nil {
		t.Fatalf("the SQL writer: %v", err)
	}
	if err := writeSQL(e, "rolled-back-1", "orders", "OrderPlaced", "o-3", payload, string(ownJSON), true); err != nil {
		t.Fatalf("the SQL writer, rolled back: %v", err)
	}
	want := 1 // rows written by SQL
	if checks {
		// No id and no metadata: the database makes the id, and the envelope is still whole.
		if err := writeSQL(e, nil, "orders", "OrderPlaced", nil, `{}`, nil, false); err != nil {
			t.Fatalf("the SQL writer without an id: %v", err)
		}
		want++
		for _, c := range []struct {
			name, topic, eventType, payload, metadata string
			id                                        any
			says                                      string
		}{
			{"no type", "orders", "", payload, "{}", nil, "empty event type"},
			{"no topic", "", "OrderPlaced", payload, "{}", nil, "empty topic"},
			{"payload not JSON", "orders", "OrderPlaced", "order 7 placed", "{}", nil, "json"},
			{"metadata value not text", "orders", "OrderPlaced", payload, `{"x_amount": 7}`, nil, "x_amount"},
			{"metadata not an object", "orders", "OrderPlaced", payload, `["a"]`, nil, "not an object of strings"},
			{"malformed trace context", "orders", "OrderPlaced", payload, `{"traceparent": "00-abc-01"}`, nil, "traceparent"},
			{"id reused", "orders", "OrderPlaced", payload, "{}", byGo.UUID, byGo.UUID},
			{"id of an event written by SQL reused", "orders", "OrderPlaced", payload, "{}", sqlID, sqlID},
		} {
			err := writeSQL(e, c.id, c.topic, c.eventType, "o-9", c.payload, c.metadata, false)
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(c.says)) {
				t.Errorf("%s: the database said %v, want an error naming %q", c.name, err, c.says)
			}
		}
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != want+1 {
		t.Fatalf("%d outbox rows, want %d: the Go writer's and %d by SQL, none of the refused or rolled back", n, want+1, want)
	}

	var (
		mu   sync.Mutex
		sent = map[string]*message.Message{}
	)
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		mu.Lock()
		defer mu.Unlock()
		sent[m.UUID] = m
		return nil
	})
	drain(t, newForwarder(t, e.Store, pub, newClock()), newClock())
	if len(sent) != want+1 {
		t.Fatalf("the relay published %d messages, want %d", len(sent), want+1)
	}
	fromGo, fromSQL := sent[byGo.UUID], sent[sqlID]
	if fromGo == nil || fromSQL == nil {
		t.Fatalf("published %v: want %s (Go) and %s (SQL)", slices.Collect(maps.Keys(sent)), byGo.UUID, sqlID)
	}
	envelope := func(m *message.Message) map[string]string {
		md := maps.Clone(m.Metadata)
		if _, ok := outboxkit.CreatedAt(m); !ok || md[outboxkit.MetadataSeq] == "" {
			t.Errorf("message %s has no created_at or seq stamp: %v", m.UUID, md)
		}
		delete(md, outboxkit.MetadataCreatedAt)
		delete(md, outboxkit.MetadataSeq)
		delete(md, outboxkit.MetadataPartitionKey) // the keys differ on purpose: o-1, o-2
		return md
	}
	if g, s := envelope(fromGo), envelope(fromSQL); !maps.Equal(g, s) {
		t.Errorf("metadata differs:\n  Go  %v\n  SQL %v", g, s)
	}
	if string(fromSQL.Payload) != payload || string(fromGo.Payload) != payload {
		t.Errorf("payloads %q (Go) and %q (SQL), want %q", fromGo.Payload, fromSQL.Payload, payload)
	}
	if outboxkit.PartitionKey(fromSQL) != "o-2" || outboxkit.EventType(fromSQL) != "OrderPlaced" {
		t.Errorf("SQL-written message: key %q, type %q", outboxkit.PartitionKey(fromSQL), outboxkit.EventType(fromSQL))
	}
	if checks {
		for id, m := range sent {
			if id == byGo.UUID || id == sqlID {
				continue
			}
			if u, err := uuid.Parse(id); err != nil || u.Version() != 7 || u.String() != id {
				t.Errorf("the id the database made, %q, is not a canonical UUIDv7", id)
			}
			if outboxkit.EventType(m) != "OrderPlaced" || m.Metadata.Get(outboxkit.MetadataContentType) != "application/json" ||
				outboxkit.PartitionKey(m) != "" || string(m.Payload) != `{}` {
				t.Errorf("the event without id or metadata was published as %v %q", m.Metadata, m.Payload)
			}
		}
	}
}

// Postgres's publish() wakes the relays at commit, as the Go writer's INSERT does: a relay given a
// 10s poll publishes the event at once. (MySQL has no wake-up; SQLite wakes the relays of the
// writing process from the Go writer only.)
func sqlWriterWakesTheRelay[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	if !strings.HasPrefix(e.Store.Info().Name, "postgres") || e.Store.Waker() == nil {
		t.Skipf("%s: no relay of this store is woken by a SQL writer (no NOTIFY, or no LISTEN)", h.Name)
	}
	if _, err := e.Store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, e.Store, pub, newClock(), func(c *forwarder.Config) {
		c.PollInterval = 10 * time.Second
		c.Now = time.Now
	})
	RunForwarder(t, f)
	for i := range 3 {
		id := uuid.Must(uuid.NewV7()).String()
		start := time.Now()
		if err := writeSQL(e, id, "orders", "OrderPlaced", "k", `{}`, nil, false); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-pub.notify:
			if got != id {
				t.Fatalf("published %s, want %s", got, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d written by publish() not published within 5s with a 10s poll: the function woke no relay", i)
		}
		t.Logf("%s: publish() commit to publish: %s", h.Name, time.Since(start))
	}
}
