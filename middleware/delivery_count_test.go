package middleware_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
)

// brokerDelivery is a fresh copy of msg carrying what a broker says of the delivery, as
// outboxkit's RabbitMQ subscriber sets it.
func brokerDelivery(msg *message.Message, redelivered bool) *message.Message {
	c := delivery(msg)
	c.SetContext(outboxkit.WithRedelivered(context.Background(), redelivered))
	return c
}

func (e *env) deliveries(t *testing.T, consumer, uuid string) (n int, lastError string) {
	t.Helper()
	err := e.pg.Pool.QueryRow(context.Background(), `SELECT deliveries, coalesce(last_error, '') FROM `+e.pg.Schema.Ident()+
		`.inbox_deliveries WHERE consumer = $1 AND message_id = $2`, consumer, uuid).Scan(&n, &lastError)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return n, lastError
}

func TestDeliveryCount_BrokerVouchedFirstDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var seen []int // Deliveries(ctx) as each handler call saw it
	fail := map[string]bool{}
	h := func(m *message.Message) error {
		seen = append(seen, middleware.Deliveries(m.Context()))
		if fail[m.UUID] {
			return errTransient
		}
		return effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = -1 })

	t.Run("a first delivery that succeeds writes no count", func(t *testing.T) {
		msg := orderMsg("ok")
		seen = nil
		if _, err := stack(brokerDelivery(msg, false)); err != nil {
			t.Fatal(err)
		}
		if n, _ := e.deliveries(t, "shipping", msg.UUID); n != 0 || len(seen) != 1 || seen[0] != 1 {
			t.Fatalf("count row %d, handler saw %v; want no row and one delivery seen as 1", n, seen)
		}
		if e.count(t, "inbox", "shipping", msg.UUID) != 1 || e.count(t, "effects", "shipping", msg.UUID) != 1 {
			t.Fatal("want one inbox row and one effect")
		}
	})

	t.Run("a failed first delivery is counted with its error, the redelivery counts on", func(t *testing.T) {
		msg := orderMsg("flaky")
		fail[msg.UUID] = true
		seen = nil
		if _, err := stack(brokerDelivery(msg, false)); err == nil {
			t.Fatal("want the handler's error")
		}
		if n, lastErr := e.deliveries(t, "shipping", msg.UUID); n != 1 || !strings.Contains(lastErr, errTransient.Error()) {
			t.Fatalf("after a failed first delivery: count %d, last error %q", n, lastErr)
		}
		delete(fail, msg.UUID)
		if _, err := stack(brokerDelivery(msg, true)); err != nil {
			t.Fatal(err)
		}
		if n, _ := e.deliveries(t, "shipping", msg.UUID); n != 2 || len(seen) != 2 || seen[1] != 2 {
			t.Fatalf("after the redelivery: count %d, handler saw %v; want 2 and [1 2]", n, seen)
		}
	})

	t.Run("a first delivery that killed the process counts when the broker redelivers", func(t *testing.T) {
		msg := orderMsg("killer")
		fail[msg.UUID] = true
		seen = nil
		// The first delivery died with the process: nothing was written. Each redelivery counts on
		// from 2, and the third is the last one MaxDeliveries allows.
		if _, err := stack(brokerDelivery(msg, true)); err == nil {
			t.Fatal("want the handler's error: nacked for another delivery")
		}
		if _, err := stack(brokerDelivery(msg, true)); err != nil {
			t.Fatalf("third delivery: %v, want it quarantined and acked", err)
		}
		if len(seen) != 2 || seen[0] != 2 || seen[1] != 3 {
			t.Fatalf("redeliveries seen as %v, want [2 3]", seen)
		}
		letters := deadLetters(t, e, middleware.DeadLetterFilter{MessageIDs: []string{msg.UUID}})
		if len(letters) != 1 || letters[0].Deliveries != 3 {
			t.Fatalf("dead letters %+v: want the message quarantined on its third delivery", letters)
		}
	})

	t.Run("without the broker's word every delivery is counted", func(t *testing.T) {
		msg := orderMsg("unknown")
		if _, err := stack(delivery(msg)); err != nil {
			t.Fatal(err)
		}
		if n, _ := e.deliveries(t, "shipping", msg.UUID); n != 1 {
			t.Fatalf("count %d, want 1", n)
		}
	})

	t.Run("CountFirstDeliveries counts them all", func(t *testing.T) {
		all := e.stack(t, "billing", effect("billing"), func(c *middleware.StackConfig) { c.CountFirstDeliveries = true })
		msg := orderMsg("counted")
		if _, err := all(brokerDelivery(msg, false)); err != nil {
			t.Fatal(err)
		}
		if n, _ := e.deliveries(t, "billing", msg.UUID); n != 1 {
			t.Fatalf("count %d, want 1", n)
		}
	})
}
