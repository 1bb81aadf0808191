package storetest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

func deliveryCountVouched[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var seen []int // Deliveries(ctx) as each handler call saw it
	fail := map[string]bool{}
	hf := func(m *message.Message) error {
		seen = append(seen, middleware.Deliveries(m.Context()))
		if fail[m.UUID] {
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = -1 })

	msg := orderMsg("ok") // a first delivery that succeeds writes no count
	if _, err := stack(brokerDelivery(msg, false)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 0 || len(seen) != 1 || seen[0] != 1 {
		t.Fatalf("count row %d, handler saw %v; want no row and one delivery seen as 1", n, seen)
	}
	if e.count(t, "inbox", "shipping", msg.UUID) != 1 || e.count(t, "effects", "shipping", msg.UUID) != 1 {
		t.Fatal("want one inbox row and one effect")
	}

	msg = orderMsg("flaky") // a failed first delivery is counted with its error, the redelivery counts on
	fail[msg.UUID] = true
	seen = nil
	if _, err := stack(brokerDelivery(msg, false)); err == nil {
		t.Fatal("want the handler's error")
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 1 ||
		e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id = ? AND last_error LIKE ?`, msg.UUID, "%"+errTransient.Error()+"%") != 1 {
		t.Fatalf("after a failed first delivery: count %d, or the error is not recorded", n)
	}
	delete(fail, msg.UUID)
	if _, err := stack(brokerDelivery(msg, true)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 2 || len(seen) != 2 || seen[1] != 2 {
		t.Fatalf("after the redelivery: count %d, handler saw %v; want 2 and [1 2]", n, seen)
	}

	msg = orderMsg("killer") // a first delivery that killed the process counts when the broker redelivers
	fail[msg.UUID] = true
	seen = nil
	if _, err := stack(brokerDelivery(msg, true)); err == nil {
		t.Fatal("want the handler's error: nacked for another delivery")
	}
	if _, err := stack(brokerDelivery(msg, true)); err != nil {
		t.Fatalf("third delivery: %v, want it dead-lettered and acked", err)
	}
	if len(seen) != 2 || seen[0] != 2 || seen[1] != 3 {
		t.Fatalf("redeliveries seen as %v, want [2 3]", seen)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{msg.UUID}}); len(letters) != 1 || letters[0].Attempts != 3 {
		t.Fatalf("dead letters %+v: want the message dead-lettered on its third delivery", letters)
	}

	msg = orderMsg("unknown") // without the broker's word every delivery is counted
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 1 {
		t.Fatalf("count %d, want 1", n)
	}

	all := e.stack(t, "billing", e.effect("billing"), func(c *middleware.StackConfig) { c.CountFirstDeliveries = true })
	msg = orderMsg("counted")
	if _, err := all(brokerDelivery(msg, false)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "billing", msg.UUID); n != 1 {
		t.Fatalf("CountFirstDeliveries: count %d, want 1", n)
	}
}

// In the full stack, a delivery held through an outage of a dependency is counted once and never
// dead-lettered, not even with MaxDeliveries 1.
func outageNeitherCounts[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var tries atomic.Int32
	hf := func(m *message.Message) error {
		if tries.Add(1) <= 5 {
			return outboxkit.Unreachable(errors.New("payment gateway: connection refused"))
		}
		return e.effect("billing")(m)
	}
	stack := e.stack(t, "billing", hf, func(c *middleware.StackConfig) {
		c.MaxDeliveries = 1
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatalf("delivery failed: %v", err)
	}
	if tries.Load() != 6 || e.count(t, "effects", "billing", msg.UUID) != 1 {
		t.Fatalf("%d tries, %d effects; want the sixth try to apply the effect once", tries.Load(), e.count(t, "effects", "billing", msg.UUID))
	}
	if n := e.count(t, "dead_letters", "billing", msg.UUID); n != 0 {
		t.Fatal("a message was dead-lettered for an unreachable dependency")
	}
	if n := e.deliveries(t, "billing", msg.UUID); n != 1 {
		t.Fatalf("the held delivery was counted %d times, want 1", n)
	}
}
