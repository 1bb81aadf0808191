package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

func failureBacksOffThenSucceeds[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"k"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(_ *message.Message, call int) error {
		if call == 1 {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk) // backoff: 1s after the first failure, no jitter
	if res := dispatch(t, f); res.Failed != 1 || res.Published != 0 {
		t.Fatalf("first pass = %+v, want one failure", res)
	}
	if n := e.MustInt(t, `SELECT attempts FROM {{schema}}.outbox WHERE uuid = ?`, msgs[0].UUID); n != 1 {
		t.Fatalf("attempts = %d, want 1", n)
	}
	letters, err := e.Store.OutboxDeadLetters(context.Background(), store.DeadLetterFilter{})
	if err != nil || len(letters) != 0 {
		t.Fatalf("a row backing off is listed as dead: %v %v", letters, err)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE last_error LIKE ?`, "%"+errBroken.Error()+"%"); n != 1 {
		t.Fatal("last_error does not hold the publisher's error")
	}
	if res := dispatch(t, f); res.Claimed != 0 {
		t.Fatalf("immediate second pass claimed %d rows; the row is not due yet", res.Claimed)
	}
	clk.Advance(999 * time.Millisecond)
	if res := dispatch(t, f); res.Claimed != 0 {
		t.Fatalf("pass just before the backoff ends claimed %d rows", res.Claimed)
	}
	clk.Advance(2 * time.Millisecond)
	if res := dispatch(t, f); res.Published != 1 {
		t.Fatalf("pass after the backoff = %+v, want the row published", res)
	}
	if got := len(pub.accepted()); got != 1 {
		t.Fatalf("accepted %d messages, want 1", got)
	}
}

func brokerOutage[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a", "b", "c", "d"}, 10)
	clk := newClock()
	pub := newFakePublisher()
	var mu sync.Mutex
	down := true
	pub.setFail(func(*message.Message, int) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return outboxkit.Unreachable(errors.New("dial tcp: connection refused"))
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 2 })
	res := dispatch(t, f)
	if res.UnreachableErr == nil || res.Failed != 0 {
		t.Fatalf("pass during outage = %+v, want an unreachable error and no counted failure", res)
	}
	res = dispatch(t, f)
	if !res.CircuitOpen || res.Claimed != 0 {
		t.Fatalf("pass with the circuit open = %+v, want it to do nothing", res)
	}
	for i := 0; i < 50; i++ { // a long outage: many probes, each failing
		clk.Advance(time.Minute)
		dispatch(t, f)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows had attempts burned by the outage", n)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	clk.Advance(time.Minute)
	if res := dispatch(t, f); res.Published != 1 {
		t.Fatalf("probe pass = %+v, want one row published", res)
	}
	drain(t, f, clk)
	if got := len(pub.accepted()); got != 40 {
		t.Fatalf("after the outage %d of 40 published", got)
	}
}

// A broker that refuses the relay's credentials is no outage that ends by itself, but no fault of
// the messages either: rows wait behind the open circuit with no attempt burned, Health says why,
// and a Run with a publisher that can check refuses to start.
func accessDeniedHoldsAndRefusesToStart[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 3)
	clk := newClock()
	pub := &checkingPublisher{fakePublisher: newFakePublisher()}
	refused := outboxkit.AccessDenied(errors.New("403 ACCESS_REFUSED: username or password not allowed"))
	pub.setFail(func(*message.Message, int) error { return outboxkit.Unreachable(refused) })
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	if res := dispatch(t, f); res.UnreachableErr == nil || res.Failed != 0 || res.DeadLettered != 0 {
		t.Fatalf("pass with refused credentials = %+v, want the rows held behind the circuit", res)
	}
	if hl := f.Health(); !hl.CircuitOpen || !outboxkit.IsAccessDenied(hl.Blocked) {
		t.Fatalf("health = %+v, want the circuit open and the refusal said", hl)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows had attempts burned by refused credentials", n)
	}
	pub.check = refused
	err := newForwarder(t, e.Store, pub, clk).Run(context.Background())
	if !outboxkit.IsAccessDenied(err) {
		t.Fatalf("Run with a broker that refuses the relay: %v, want it to refuse to start", err)
	}
}

// checkingPublisher is a fake publisher with a Check, as the backends' publishers have.
type checkingPublisher struct {
	*fakePublisher
	check error
}

func (p *checkingPublisher) Check(context.Context) error { return p.check }

// Run on tables never migrated refuses to start, naming the version to migrate to.
func runRefusesUnmigratedTables[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	err := newForwarder(t, e.Store, newFakePublisher(), newClock()).Run(context.Background())
	if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "needs version") {
		t.Fatalf("Run on unmigrated tables: %v, want ErrNotMigrated naming the version", err)
	}
}
