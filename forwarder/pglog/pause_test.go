package pglog_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// pauseAndWait pauses scope/name and waits until the relay named relay acknowledged it in its
// heartbeat (as the console shows it): from then on it honours the pause. Its last pass stays
// current, idle or paused.
func pauseAndWait(t *testing.T, con store.Console, relay, scope, name string) {
	t.Helper()
	ctx := context.Background()
	at := time.Now()
	if ok, err := con.SetPause(ctx, store.Pause{Scope: scope, Name: name, By: "test", At: at}); err != nil || !ok {
		t.Fatalf("pause %s %s: %v %v", scope, name, ok, err)
	}
	testenv.Eventually(t, 10*time.Second, "the relay acknowledging the pause", func() bool {
		relays, err := con.Relays(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range relays {
			if r.Name == relay && r.PausesSeen.After(at) && r.LastPass.After(at) {
				return true
			}
		}
		return false
	})
}

// index is the position of id's first delivery, -1 if none.
func (r *recorder) index(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.order {
		if m.UUID == id {
			return i
		}
	}
	return -1
}

// A paused topic holds its events, and the later events of their keys whatever their topic, while
// other keys flow; the slot is not confirmed past a held event, and its row stays in the outbox.
// A paused relay publishes nothing and holds the slot (its lag grows, shown in its status). Resumed,
// the held events go at once, in each key's order.
func TestPausesHoldEventsInKeyOrderUntilResumed(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	con, ok := store.ConsoleOf(pg.Store)
	if !ok {
		t.Fatal("the Postgres store keeps no pauses")
	}
	pub := newRecorder()
	r := relayOn(t, pg, pub, func(f *forwarder.Config, c *pglog.Config) {
		f.Name = "paused"
		f.HeartbeatInterval = 50 * time.Millisecond
		c.Window = 8 // the events flowing past a held one must not fill it
	})
	run(t, r)
	ctx := context.Background()
	walEnd := func() int { return pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`) }
	confirmed := func() int {
		return pg.Int(t, `SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1`, r.SlotName())
	}
	status := func() forwarder.SlotStatus {
		s, err := r.SlotStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// A topic paused: k1's event of it holds k1's later "orders" event; k1's earlier one and
	// every other key flow, well past Window events.
	pauseAndWait(t, con, "paused", store.PauseTopic, "held")
	first := write(t, pg, "k1", 1)
	beforeHeld := walEnd()
	held := writeTo(t, pg, "held", "k1", 1)
	behind := write(t, pg, "k1", 1)
	unkeyed := writeTo(t, pg, "held", "", 1)
	var others []string
	for i := range 30 {
		others = append(others, write(t, pg, fmt.Sprintf("o%d", i%5), 1)...)
	}
	testenv.Eventually(t, 10*time.Second, "the other keys' events, past Window", func() bool { return pub.has(first) && pub.has(others) })
	testenv.Eventually(t, 10*time.Second, "three events held", func() bool { return status().HeldEvents == 3 })
	for _, id := range slices.Concat(held, behind, unkeyed) {
		if pub.count(id) != 0 {
			t.Fatalf("event %s published while held by a paused topic", id)
		}
	}
	if c := confirmed(); c > beforeHeld {
		t.Fatalf("slot confirmed at %d, past the held event's transaction (which began after %d)", c, beforeHeld)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE uuid = ANY($1::uuid[])`, slices.Concat(held, behind, unkeyed)); n != 3 {
		t.Fatalf("%d of the 3 held events' rows left in the outbox", n)
	}
	if _, err := con.ClearPause(ctx, store.PauseTopic, "held"); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testenv.Eventually(t, 10*time.Second, "the held events after the resume", func() bool {
		return pub.has(held) && pub.has(behind) && pub.has(unkeyed)
	})
	t.Logf("held events published %s after the resume (heartbeat 50ms)", time.Since(resumed).Round(time.Millisecond))
	if h, b := pub.index(held[0]), pub.index(behind[0]); h > b {
		t.Errorf("k1's later event published before its held one (%d, %d)", b, h)
	}

	// The relay paused: it reads but publishes nothing; its status and the slot's lag show it.
	pauseAndWait(t, con, "paused", store.PauseRelay, "paused")
	beforePause := walEnd()
	var waiting []string
	for i := range 2 { // within Window, with their transactions' ends
		waiting = append(waiting, write(t, pg, fmt.Sprintf("k%d", i), 2)...)
	}
	var last forwarder.SlotStatus
	watching := true
	defer func() {
		if watching && t.Failed() {
			t.Logf("last status: paused %v, held %d of %d, lag %d bytes; published %d of them", last.Paused, last.HeldEvents,
				len(waiting), last.LagBytes, published(pub, waiting))
		}
	}()
	testenv.Eventually(t, 10*time.Second, "the paused relay holding what it read", func() bool {
		last = status()
		return last.Paused && last.HeldEvents == len(waiting) && last.LagBytes > 0
	})
	watching = false
	for _, id := range waiting {
		if pub.count(id) != 0 {
			t.Fatalf("event %s published by a paused relay", id)
		}
	}
	if c := confirmed(); c > beforePause {
		t.Fatalf("a paused relay's slot confirmed at %d, past the events it holds (written after %d)", c, beforePause)
	}
	if _, err := con.ClearPause(ctx, store.PauseRelay, "paused"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the events after the relay's resume", func() bool { return pub.has(waiting) })
	testenv.Eventually(t, 10*time.Second, "nothing held, the slot confirmed past them", func() bool {
		return status().HeldEvents == 0 && confirmed() > beforePause
	})
	if d := pub.duplicates(); d != 0 {
		t.Errorf("%d duplicates across pauses", d)
	}
}

// published counts the events of ids r has published.
func published(r *recorder, ids []string) int {
	n := 0
	for _, id := range ids {
		if r.count(id) > 0 {
			n++
		}
	}
	return n
}
