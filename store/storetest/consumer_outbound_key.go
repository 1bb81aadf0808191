package storetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
)

// The handler's outbound idempotency key is the same on every delivery of a message (a failed
// attempt and its redelivery) and differs between consumers; outside an inbox there is none.
func outboundKeyStable[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var keys []string
	failOnce := true
	record := func(consumer string) message.NoPublishHandlerFunc {
		return func(m *message.Message) error {
			k, ok := middleware.OutboundKey(m.Context())
			if !ok {
				return errors.New("no outbound key inside the stack")
			}
			keys = append(keys, consumer+" "+k)
			if consumer == "billing" && failOnce {
				failOnce = false
				return errTransient // rolled back: the call would be made again on the redelivery
			}
			return e.effect(consumer)(m)
		}
	}
	billing := e.stack(t, "billing", record("billing"), func(c *middleware.StackConfig) { c.MaxRetries = -1 })
	shipping := e.stack(t, "shipping", record("shipping"))
	msg := orderMsg("o-1")
	if _, err := billing(delivery(msg)); !errors.Is(err, errTransient) {
		t.Fatalf("first delivery: %v", err)
	}
	for _, run := range []message.HandlerFunc{billing, shipping} {
		if _, err := run(delivery(msg)); err != nil {
			t.Fatal(err)
		}
	}
	b, s := outboxkit.OutboundKey("billing", msg.UUID), outboxkit.OutboundKey("shipping", msg.UUID)
	want := []string{"billing " + b, "billing " + b, "shipping " + s}
	if !slices.Equal(keys, want) || b == s {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	if _, ok := middleware.OutboundKey(msg.Context()); ok {
		t.Fatal("an outbound key outside the stack")
	}
}
