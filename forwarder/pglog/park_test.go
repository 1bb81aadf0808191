package pglog_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// With ParkKeyOnDeadLetter a key's events after its dead letter wait — left in the outbox (in WAL
// mode written there), the slot moving past them — while other keys flow, across a restart of
// the relay; replayed, the dead letter goes first and its key's events follow it, in order, once
// each.
func TestParkedKeyWaitsForItsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, mode := range []pglog.Mode{pglog.ModeTable, pglog.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			pub := &refusing{recorder: newRecorder()}
			pub.refuse.Store(true)
			tune := func(f *forwarder.Config, c *pglog.Config) {
				f.MaxAttempts, f.ParkKeyOnDeadLetter, c.Mode = 1, true, mode
			}
			r := relayOn(t, pg, pub, tune)
			stop := run(t, r)
			emit := func(key string) string {
				t.Helper()
				if mode == pglog.ModeTable {
					return write(t, pg, key, 1)[0]
				}
				id, err := transact(walStore(t, pg), key)
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			e1 := emit("bad")
			testenv.Eventually(t, 10*time.Second, "e1 dead-lettered", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
			})
			pub.refuse.Store(false) // from here the broker takes anything: only parking holds the key
			e2, e3 := emit("bad"), emit("bad")
			var wrote string
			if err := pg.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&wrote); err != nil {
				t.Fatal(err)
			}
			ok1 := emit("ok")
			testenv.Eventually(t, 10*time.Second, "another key's event", func() bool { return pub.has([]string{ok1}) })
			testenv.Eventually(t, 10*time.Second, "the slot confirmed past the parked events", func() bool {
				return pg.Int(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2::text::pg_lsn`,
					r.SlotName(), wrote) == 1
			})
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE partition_key = 'bad' AND dead_lettered_at IS NULL`); n != 2 {
				t.Fatalf("%d rows of the parked key wait in the outbox, want e2 and e3", n)
			}

			// A restart while the key is parked: what waits stays, what comes meanwhile waits too.
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			e4 := emit("bad")
			run(t, relayOn(t, pg, pub, tune))
			ok2 := emit("ok")
			testenv.Eventually(t, 10*time.Second, "another key's event after the restart", func() bool { return pub.has([]string{ok2}) })
			for _, id := range []string{e1, e2, e3, e4} {
				if pub.count(id) != 0 {
					t.Fatalf("an event of the parked key was published before its dead letter's replay")
				}
			}

			if mode == pglog.ModeTable {
				consoleReplay(t, pg)
			} else if letters, err := pg.Store.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{MessageIDs: []string{e1}}); err != nil || len(letters) != 1 {
				t.Fatalf("replay: %d letters, %v", len(letters), err)
			}
			want := []string{e1, e2, e3, e4}
			testenv.Eventually(t, 10*time.Second, "the dead letter and its key's events", func() bool { return pub.has(want) })
			for i := 1; i < len(want); i++ {
				if pub.index(want[i-1]) > pub.index(want[i]) {
					t.Fatalf("e%d published before e%d", i+1, i)
				}
			}
			for i, id := range want {
				if n := pub.count(id); n != 1 {
					t.Errorf("e%d published %d times", i+1, n)
				}
			}
			testenv.Eventually(t, 10*time.Second, "their rows removed once published", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0
			})
		})
	}
}

// A parked key stays parked through the backfill of a lost slot (which reads every row waiting in
// the table, the parked ones too), and an archive of its dead letter — an UPDATE, which the log
// does not carry — unparks it: its events go, in order.
func TestParkedKeyThroughBackfillAndArchive(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &refusing{recorder: newRecorder()}
	pub.refuse.Store(true)
	tune := func(f *forwarder.Config, _ *pglog.Config) { f.MaxAttempts, f.ParkKeyOnDeadLetter = 1, true }
	r := relayOn(t, pg, pub, tune)
	stop := run(t, r)
	e1 := write(t, pg, "bad", 1)[0]
	testenv.Eventually(t, 10*time.Second, "e1 dead-lettered", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
	})
	pub.refuse.Store(false)
	e2 := write(t, pg, "bad", 1)[0]
	ok1 := write(t, pg, "ok", 1)[0]
	testenv.Eventually(t, 10*time.Second, "another key's event", func() bool { return pub.has([]string{ok1}) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e3 := write(t, pg, "bad", 1)[0]
	testenv.Eventually(t, 10*time.Second, "the slot dropped once its reader has gone", func() bool {
		_, err := pg.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, r.SlotName())
		return err == nil
	})
	run(t, relayOn(t, pg, pub, tune))
	ok2 := write(t, pg, "ok", 1)[0]
	testenv.Eventually(t, 10*time.Second, "another key's event after the backfill", func() bool { return pub.has([]string{ok2}) })
	for _, id := range []string{e1, e2, e3} {
		if pub.count(id) != 0 {
			t.Fatalf("an event of the parked key was published by the backfill")
		}
	}
	consoleJob(t, pg, store.JobArchive)
	testenv.Eventually(t, 10*time.Second, "the key's events after the archive", func() bool { return pub.has([]string{e2, e3}) })
	if pub.index(e2) > pub.index(e3) || pub.count(e2) != 1 || pub.count(e3) != 1 || pub.count(e1) != 0 {
		t.Fatalf("after the archive: e1 %d, e2 %d, e3 %d times, e2 at %d, e3 at %d; want e2 then e3 once each, e1 never",
			pub.count(e1), pub.count(e2), pub.count(e3), pub.index(e2), pub.index(e3))
	}
	testenv.Eventually(t, 10*time.Second, "their rows removed, the archived letter kept", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 1
	})
}

// A parked key's rows before its dead letter are not read back while it is parked: one published
// and not yet removed (the window's head held by a paused topic) is published once.
func TestParkedKeyReadsNoPublishedRowAgain(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	con, _ := store.ConsoleOf(pg.Store)
	pub := &refusing{recorder: newRecorder()}
	relay := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) {
		f.Name, f.HeartbeatInterval, f.MaxAttempts, f.ParkKeyOnDeadLetter = "parkheld", 50*time.Millisecond, 1, true
	})
	run(t, relay)
	pauseAndWait(t, con, "parkheld", "topic", "held")
	writeTo(t, pg, "held", "h", 1)
	e0 := write(t, pg, "bad", 1)[0]
	testenv.Eventually(t, 10*time.Second, "e0 published", func() bool { return pub.has([]string{e0}) })
	pub.refuse.Store(true)
	write(t, pg, "bad", 1)
	testenv.Eventually(t, 10*time.Second, "e1 dead-lettered", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
	})
	pub.refuse.Store(false)
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE uuid = $1::uuid`, e0); n != 1 {
		t.Fatalf("e0's row removed already: the test needs it in the table (the window's head held)")
	}
	// Twenty reads of the parked key from the table, each of which could have read e0 back.
	from := pglog.ParkedChecks(relay)
	testenv.Eventually(t, 30*time.Second, "twenty reads of the parked keys", func() bool {
		if n := pub.count(e0); n != 1 {
			t.Fatalf("e0 published %d times while its key is parked", n)
		}
		return pglog.ParkedChecks(relay) >= from+20
	})
	if n := pub.count(e0); n != 1 {
		t.Fatalf("e0 published %d times while its key is parked", n)
	}
}

// gate refuses, as message failures, the key "bad" while refuse is set and the ids in block.
type gate struct {
	*recorder
	refuse  atomic.Bool
	mu      sync.Mutex
	block   map[string]bool
	refused map[string]int
}

func (g *gate) Publish(topic string, msgs ...*message.Message) error {
	g.mu.Lock()
	for _, m := range msgs {
		if g.block[m.UUID] || (g.refuse.Load() && m.Metadata.Get(outboxkit.MetadataPartitionKey) == "bad") {
			g.refused[m.UUID]++
			g.mu.Unlock()
			return errors.New("message too large")
		}
	}
	g.mu.Unlock()
	return g.recorder.Publish(topic, msgs...)
}

func (g *gate) refusals(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused[id]
}

// A relay killed while it publishes the rows a replay unparked, some gone and some not, loses
// none: the key's rows leave the table together, so the next session finds the replayed dead
// letter there and reads them all back.
func TestKilledWhileUnparkingLosesNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &gate{recorder: newRecorder(), block: map[string]bool{}, refused: map[string]int{}}
	pub.refuse.Store(true)
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.MaxAttempts, f.ParkKeyOnDeadLetter = 1, true })
	stop := run(t, r)
	e1 := write(t, pg, "bad", 1)[0]
	testenv.Eventually(t, 10*time.Second, "e1 dead-lettered", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
	})
	pub.refuse.Store(false)
	e2, e3 := write(t, pg, "bad", 1)[0], write(t, pg, "bad", 1)[0]
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	pub.block[e3] = true // fails, backing off, until the end
	pub.mu.Unlock()
	tune := func(f *forwarder.Config, _ *pglog.Config) { f.MaxAttempts, f.ParkKeyOnDeadLetter = 1000, true }
	r2 := relayOn(t, pg, pub, tune)
	pglog.CrashOnStop(r2)
	crash := run(t, r2)
	consoleReplay(t, pg)
	testenv.Eventually(t, 10*time.Second, "e1 and e2 published, e3 refused a few times", func() bool {
		return pub.has([]string{e1, e2}) && pub.refusals(e3) >= 5
	})
	if err := crash(); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	pub.block[e3] = false
	pub.mu.Unlock()
	run(t, relayOn(t, pg, pub, tune))
	testenv.Eventually(t, 10*time.Second, "e3 after the restart", func() bool { return pub.has([]string{e3}) })
	testenv.Eventually(t, 10*time.Second, "the key's rows removed", func() bool { return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0 })
}
