package middleware

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A message handled inside another's handler, with a context derived from the other's, is a
// delivery of its own: sharing the outer one's record, it would pass for an in-process retry of it
// (uncounted) and overwrite its count, lock and transaction.
func TestDeliveryOfAMessageHandledInsideAnothersIsItsOwn(t *testing.T) {
	outer := message.NewMessage("outer", nil)
	d := deliveryOf(outer)
	d.count, d.counted = 3, true
	inner := message.NewMessage("inner", nil)
	inner.SetContext(outer.Context())
	if got := deliveryOf(inner); got == d || got.counted || got.count != 0 {
		t.Fatalf("the inner message got the outer one's delivery record (%+v)", *got)
	}
	if Deliveries(inner.Context()) != 0 || Deliveries(outer.Context()) != 3 {
		t.Fatalf("Deliveries: inner %d, outer %d; want 0 and 3", Deliveries(inner.Context()), Deliveries(outer.Context()))
	}
	if deliveryOf(outer) != d {
		t.Fatal("the outer message lost its delivery record")
	}
}
