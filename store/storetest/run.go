package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

func runTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"ACommitIsPublishedAtOnce", writerWakesTheRelay[TTx]},
		{"ACommitBySQLIsPublishedAtOnce", sqlWriterWakesTheRelay[TTx]},
		{"PollsWithoutWakeUps", pollsWithoutWakeUps[TTx]},
		{"RefusesASecondConcurrentRun", refusesASecondRun[TTx]},
	}
}

// RunForwarder starts f.Run until the test ends, checking that it returns promptly and cleanly,
// and waits until it is running (listening, where the store wakes relays).
func RunForwarder(t testing.TB, f *forwarder.Forwarder) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of cancel")
		}
	})
	select {
	case <-f.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("forwarder did not start within 10s")
	}
}

// A commit is published at once with the default settings. A store whose writers wake relays
// (Postgres NOTIFY, SQLite in-process) is given a 10s poll, so only the wake-up can explain a
// prompt publish; a store without wake-ups (MySQL) must get the short default poll.
func writerWakesTheRelay[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	wakes := e.Store.Waker() != nil
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, e.Store, pub, newClock(), func(c *forwarder.Config) {
		c.PollInterval = 0 // the default for this store
		if wakes {
			c.PollInterval = 10 * time.Second
		}
		c.Now = time.Now
	})
	if got := f.Config().PollInterval; !wakes && got != forwarder.DefaultPollIntervalWithoutWake {
		t.Fatalf("%s: a store without wake-ups polls every %s by default, want %s", h.Name, got, forwarder.DefaultPollIntervalWithoutWake)
	}
	RunForwarder(t, f)
	var latencies []time.Duration
	for i := 0; i < 15; i++ {
		start := time.Now()
		msg := write(t, e, []string{"k"}, 1)[0]
		select {
		case got := <-pub.notify:
			if got != msg.UUID {
				t.Fatalf("published %s, want %s", got, msg.UUID)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d not published within 5s (poll %s, woken by writers: %v)", i, f.Config().PollInterval, wakes)
		}
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	median := latencies[len(latencies)/2]
	t.Logf("%s: commit-to-publish (poll %s, woken by writers: %v): median %s, max %s", h.Name, f.Config().PollInterval, wakes, median, latencies[len(latencies)-1])
	if median > time.Second {
		t.Fatalf("median %s: commits wait for the poll", median)
	}
}

// Every store: with no wake-up, the poll finds new rows.
func pollsWithoutWakeUps[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, pollOnly{e.Store}, pub, newClock(), func(c *forwarder.Config) {
		c.PollInterval = 300 * time.Millisecond
		c.Now = time.Now
	})
	RunForwarder(t, f)
	msg := write(t, e, []string{"k"}, 1)[0]
	select {
	case got := <-pub.notify:
		if got != msg.UUID {
			t.Fatalf("published %s, want %s", got, msg.UUID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a polling relay did not publish within 5s with a 300ms poll")
	}
}

func refusesASecondRun[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	f := newForwarder(t, e.Store, newFakePublisher(), newClock())
	RunForwarder(t, f)
	if err := f.Run(context.Background()); err == nil {
		t.Fatal("a second Run on the same Forwarder started")
	}
}

// pollOnly is a store whose writers do not wake relays.
type pollOnly struct{ store.Store }

func (pollOnly) Waker() store.Waker { return nil }
