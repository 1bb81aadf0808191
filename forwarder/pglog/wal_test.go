package pglog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/internal/walmsg"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

func walStore(t *testing.T, pg *testenv.PG) *pgxstore.Store {
	t.Helper()
	st, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), WAL: true, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func walMode(_ *forwarder.Config, c *pglog.Config) { c.Mode = pglog.ModeWAL }

// transact writes one event with Transact and returns its id.
func transact(st *pgxstore.Store, key string) (string, error) {
	var id string
	err := st.Transact(context.Background(), pgx.TxOptions{}, func(_ pgx.Tx, pub *pipeline.Publisher) error {
		msg, err := pipeline.NewJSONEvent("OrderPlaced", key, map[string]string{"id": key})
		if err != nil {
			return err
		}
		id = msg.UUID
		return pub.Publish("orders", msg)
	})
	return id, err
}

// In WAL mode writers refuse until the relay has made its slot (an event written before would be
// read by nobody); then events go through the log alone, no row written.
func TestWALWritersWaitForTheSlotThenLeaveNoRow(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	st := walStore(t, pg)
	if _, err := transact(st, "o-0"); !errors.Is(err, pgxstore.ErrNoWALRelay) {
		t.Fatalf("Transact before the relay's slot: got %v, want ErrNoWALRelay", err)
	}
	pub := newRecorder()
	run(t, relayOn(t, pg, pub, walMode))
	var ids []string
	for _, key := range []string{"o-1", "o-2", "o-1"} {
		id, err := transact(st, key)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-3", map[string]string{"id": "o-3"})
	if err := p.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, msg.UUID)
	testenv.Eventually(t, 10*time.Second, "events written to the log", func() bool { return pub.has(ids) })
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Errorf("%d outbox rows in WAL mode", n)
	}
}

// A message with the outbox's prefix that does not decode is dead-lettered, and the slot moves
// past it: the events after it arrive.
func TestUndecodableMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	st := walStore(t, pg)
	pub := newRecorder()
	r := relayOn(t, pg, pub, walMode)
	run(t, r)
	pg.Exec(t, `SELECT pg_logical_emit_message(true, $1, '\x00deadbeef'::bytea)`, walmsg.Prefix(string(pg.Schema)))
	id, err := transact(st, "o-1")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the event after the undecodable one", func() bool { return pub.has([]string{id}) })
	testenv.Eventually(t, 10*time.Second, "the undecodable message dead-lettered", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND payload = '\x00deadbeef'::bytea
			AND last_error LIKE '%does not decode%'`) == 1
	})
	if len(pub.order) != 1 {
		t.Errorf("%d messages published, want the good one alone", len(pub.order))
	}
}

// In WAL mode a lost slot stops the relay with ErrSlotLost (its events cannot be read again),
// unless told to skip them.
func TestWALSlotLostStopsTheRelay(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	r := relayOn(t, pg, newRecorder(), walMode)
	if err := run(t, r)(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the slot dropped once its reader has gone", func() bool {
		_, err := pg.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, r.SlotName())
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := relayOn(t, pg, newRecorder(), walMode).Run(ctx)
	if !errors.Is(err, pglog.ErrSlotLost) || !strings.Contains(err.Error(), "SkipLostEvents") {
		t.Fatalf("got %v, want ErrSlotLost saying how to go on", err)
	}
	run(t, relayOn(t, pg, newRecorder(), func(f *forwarder.Config, c *pglog.Config) { walMode(f, c); c.SkipLostEvents = true }))
}

// A database/sql writer in WAL mode writes to the log as pgx's does.
func TestWALWriterOnDatabaseSQL(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	st, err := pgsqlstore.New(pg.DB, pgsqlstore.Config{Schema: string(pg.Schema), WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	pub := newRecorder()
	run(t, relayOn(t, pg, pub, walMode))
	ctx := context.Background()
	tx, err := pg.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-1", map[string]string{"id": "o-1"})
	if err := p.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the event written through database/sql", func() bool { return pub.has([]string{msg.UUID}) })
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Errorf("%d outbox rows in WAL mode", n)
	}
}

// What SkipLostEvents loses in WAL mode is the events of the log alone: an outbox row waiting in
// the table while the slot was lost (here a dead letter replayed while the relay was stopped, its
// INSERT in the WAL the lost slot held) is read back by the backfill of the new slot.
func TestWALSkipLostEventsKeepsTheRowsOfTheTable(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &refusing{recorder: newRecorder()}
	pub.refuse.Store(true)
	tune := func(f *forwarder.Config, c *pglog.Config) { f.MaxAttempts = 1; walMode(f, c) }
	r := relayOn(t, pg, pub, tune)
	stop := run(t, r)
	id, err := transact(walStore(t, pg), "bad")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the refused event dead-lettered", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	pub.refuse.Store(false)
	if letters, err := pg.Store.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{MessageIDs: []string{id}}); err != nil || len(letters) != 1 {
		t.Fatalf("replay: %d letters, %v", len(letters), err)
	}
	lost, err := transact(walStore(t, pg), "gone") // an event of the log: lost with the slot
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the slot dropped once its reader has gone", func() bool {
		_, err := pg.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, r.SlotName())
		return err == nil
	})
	run(t, relayOn(t, pg, pub, func(f *forwarder.Config, c *pglog.Config) { tune(f, c); c.SkipLostEvents = true }))
	testenv.Eventually(t, 10*time.Second, "the replayed row published", func() bool { return pub.has([]string{id}) })
	testenv.Eventually(t, 10*time.Second, "its row removed", func() bool { return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0 })
	if pub.count(lost) != 0 {
		t.Errorf("an event of the lost slot's log was published: the test does not lose the slot")
	}
}
