package forwarder_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// pollStore is a SQLite outbox that records when each pass claims and what it found. Its writers
// wake nobody (its own Waker replaces SQLite's): wake-ups come only from the test, through Wake.
type pollStore struct {
	*sqlitestore.Store
	waking bool

	mu      sync.Mutex
	passes  []time.Time
	claimed []int
	wake    func()
}

func (s *pollStore) Waker() store.Waker {
	if !s.waking {
		return nil
	}
	return s
}

func (s *pollStore) Listen(ctx context.Context, wake, listening func(), _ func(error)) {
	s.mu.Lock()
	s.wake = wake
	s.mu.Unlock()
	listening()
	<-ctx.Done()
}

// Wake wakes the relay as a writer's commit would.
func (s *pollStore) Wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wake()
}

func (s *pollStore) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	c, err := s.Store.Claim(ctx, p)
	if err == nil {
		s.mu.Lock()
		s.passes = append(s.passes, time.Now())
		s.claimed = append(s.claimed, len(c.Rows()))
		s.mu.Unlock()
	}
	return c, err
}

// waitPasses waits until at least n passes have run and cond, when set, holds of them, and
// returns the times of every pass so far.
func (s *pollStore) waitPasses(t *testing.T, n int, cond func(passes []time.Time, claimed []int) bool) []time.Time {
	t.Helper()
	var passes []time.Time
	var claimed []int
	if !testenv.Within(10*time.Second, func() bool {
		s.mu.Lock()
		passes, claimed = append([]time.Time(nil), s.passes...), append([]int(nil), s.claimed...)
		s.mu.Unlock()
		return len(passes) >= n && (cond == nil || cond(passes, claimed))
	}) {
		t.Fatalf("after 10s: %d passes, want %d or more", len(passes), n)
	}
	return passes
}

// runIdle runs a relay on st until the test ends.
func runIdle(t *testing.T, st *pollStore, poll, idle time.Duration) {
	t.Helper()
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: &flakyBroker{}, PollInterval: poll, IdlePollInterval: idle})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-f.Running()
}

func writeRow(t *testing.T, st *sqlitestore.Store) {
	t.Helper()
	ctx := context.Background()
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// While passes find nothing, each wait is twice the last, from PollInterval up to
// IdlePollInterval, where it stays.
func TestIdlePollInterval_EmptyPassesSlowThePollUpToIt(t *testing.T) {
	const poll, idle = 2 * time.Millisecond, 64 * time.Millisecond
	st := &pollStore{Store: openOutbox(t, 0)}
	runIdle(t, st, poll, idle)
	// 14 passes take about 0.6s when the wait stops at 64ms, 16s if it kept doubling.
	passes := st.waitPasses(t, 14, nil)
	for i := 1; i < 14; i++ {
		want := min(poll<<(i-1), idle)
		if gap := passes[i].Sub(passes[i-1]); gap < want*9/10 {
			t.Errorf("wait before pass %d: %s, want at least %s (%s ±10%%)", i, gap, want*9/10, want)
		}
	}
}

// A pass that claims rows brings the wait back to PollInterval.
func TestIdlePollInterval_APassThatClaimsResetsIt(t *testing.T) {
	const poll, idle = 2 * time.Millisecond, 500 * time.Millisecond
	st := &pollStore{Store: openOutbox(t, 0)}
	runIdle(t, st, poll, idle)
	st.waitPasses(t, 10, nil) // the wait is 500ms now
	writeRow(t, st.Store)     // no wake-up: the next poll finds it
	var at int
	passes := st.waitPasses(t, 0, func(_ []time.Time, claimed []int) bool {
		for i, n := range claimed {
			if n > 0 {
				at = i
				return len(claimed) >= i+4
			}
		}
		return false
	})
	// Back at 2ms, then 2, 4: about 8ms; still at 500ms, 1.5s.
	if took := passes[at+3].Sub(passes[at]); took > 3*idle/2 {
		t.Errorf("3 passes after the one that claimed a row took %s: the wait did not go back to PollInterval", took)
	}
}

// A writer's wake-up brings the wait back to PollInterval.
func TestIdlePollInterval_AWakeUpResetsIt(t *testing.T) {
	const poll, idle = 2 * time.Millisecond, 500 * time.Millisecond
	st := &pollStore{Store: openOutbox(t, 0), waking: true}
	runIdle(t, st, poll, idle)
	st.waitPasses(t, 10, nil) // the wait is 500ms now
	woke := time.Now()
	st.Wake()
	passes := st.waitPasses(t, 0, func(passes []time.Time, _ []int) bool {
		n := 0
		for _, p := range passes {
			if p.After(woke) {
				n++
			}
		}
		return n >= 4
	})
	first := 0
	for passes[first].Before(woke) {
		first++
	}
	// The woken pass at once, then 2, 4, 8ms; still at 500ms, 1.5s.
	if took := passes[first+3].Sub(woke); took > 3*idle/2 {
		t.Errorf("4 passes after the wake-up took %s: the wait did not go back to PollInterval", took)
	}
}
