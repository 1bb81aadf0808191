package mysqlbinlog_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// pauseAndWait pauses scope/name and waits until the relay named relay acknowledged it in its
// heartbeat (as the console shows it): from then on it honours the pause.
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

// A paused topic holds its rows, and the later rows of their keys whatever their topic, while
// other keys flow; the held rows stay in the outbox (the checkpoint does not pass them). A paused
// relay publishes nothing. Resumed, the held rows go, in each key's order, once each.
func TestPausesHoldRowsInKeyOrderUntilResumed(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	con, ok := store.ConsoleOf(o.store)
	if !ok {
		t.Fatal("the MySQL store keeps no pauses")
	}
	pub := newRecorder()
	run(t, relayOn(t, o, pub, func(f *forwarder.Config, _ *mysqlbinlog.Config) {
		f.Name = "paused"
		f.HeartbeatInterval = 50 * time.Millisecond
	}))
	ctx := context.Background()

	pauseAndWait(t, con, "paused", store.PauseTopic, "held")
	first := o.write(t, "k1", 1)
	held := o.writeTo(t, "held", "k1", 1)
	behind := o.write(t, "k1", 1)
	var others []string
	for i := range 10 {
		others = append(others, o.write(t, fmt.Sprintf("o%d", i%3), 1)...)
	}
	testenv.Eventually(t, 10*time.Second, "the other keys' rows", func() bool { return pub.has(first) && pub.has(others) })
	testenv.Eventually(t, 10*time.Second, "the published rows to leave the outbox, the held ones to stay", func() bool {
		return o.count(t, "1") == 2
	})
	for _, id := range slices.Concat(held, behind) {
		if pub.count(id) != 0 {
			t.Fatalf("row %s published while held by a paused topic", id)
		}
	}
	if _, err := con.ClearPause(ctx, store.PauseTopic, "held"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the held rows after the resume", func() bool { return pub.has(held) && pub.has(behind) })
	if h, b := pub.index(held[0]), pub.index(behind[0]); h > b {
		t.Errorf("k1's later row published before its held one (%d, %d)", b, h)
	}

	pauseAndWait(t, con, "paused", store.PauseRelay, "paused")
	waiting := append(o.write(t, "k2", 2), o.write(t, "k3", 1)...)
	// The relay reads them, and its heartbeat reports a pass while paused: a few beats later,
	// nothing of them is published.
	beat := time.Now()
	testenv.Eventually(t, 10*time.Second, "two heartbeats of the paused relay", func() bool {
		relays, err := con.Relays(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(relays) == 1 && relays[0].LastPass.After(beat.Add(100*time.Millisecond))
	})
	for _, id := range waiting {
		if pub.count(id) != 0 {
			t.Fatalf("row %s published by a paused relay", id)
		}
	}
	if _, err := con.ClearPause(ctx, store.PauseRelay, "paused"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the rows after the relay's resume", func() bool { return pub.has(waiting) })
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
	if d := pub.duplicated(); len(d) > 0 {
		t.Errorf("%d rows published twice across pauses", len(d))
	}
}
