package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// heldUntilCancelled delivers msg through stack with a context it cancels once the consumer's
// circuit has opened and failed a probe — the message is held, not settled — and returns what the
// stack returned then.
func (e *consumerEnv[TTx]) heldUntilCancelled(t *testing.T, consumer string, stack message.HandlerFunc, msg *message.Message) error {
	t.Helper()
	ctx, cancel := context.WithCancel(msg.Context())
	defer cancel()
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := stack(msg)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for e.gauge(t, "outboxkit_consumer_circuit_state", consumer) != float64(middleware.CircuitOpen) {
		select {
		case err := <-done:
			t.Fatalf("the delivery was settled (%v) instead of being held", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer's circuit did not open")
		}
	}
	cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the held delivery did not end when its context did")
		return nil
	}
}

// wrongTx is a transaction type no store gives.
type wrongTx struct{ _ int }

// A handler written for another transaction type than the store's is a mistake in the program:
// every message waits (the circuit holds it), nothing is dead-lettered or counted, and the error
// names both types.
func misconfiguredTxType[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	wrong := handlers.JSON(func(context.Context, *wrongTx, order) error { return nil })
	stack := e.stack(t, "shipping", wrong, func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	err := e.heldUntilCancelled(t, "shipping", stack, brokerDelivery(msg, false))
	var tte *outboxkit.TxTypeError
	if !errors.As(err, &tte) || !strings.Contains(err.Error(), "*storetest.wrongTx") || strings.Contains(err.Error(), "<nil>") {
		t.Fatalf("held with %v; want an *outboxkit.TxTypeError naming both types", err)
	}
	var store TTx
	if tte.Got == nil || tte.Got.String() == "" || !strings.Contains(err.Error(), fmt.Sprintf("%T", store)) && fmt.Sprintf("%T", store) != "<nil>" {
		t.Fatalf("the error names %v as the store's type: %v", tte.Got, err)
	}
	if n := e.count(t, "dead_letters", "shipping", msg.UUID); n != 0 {
		t.Fatal("a message was dead-lettered for a mistake in the program")
	}
	if n := e.count(t, "inbox", "shipping", msg.UUID); n != 0 {
		t.Fatal("the message has an inbox row although its handler never ran")
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n > 1 {
		t.Fatalf("the held delivery was counted %d times, want at most once", n)
	}
}

// A message a subscriber delivered for another consumer than the stack's is held, not recorded
// under the stack's name.
func misconfiguredConsumer[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"), func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	d := delivery(msg)
	d.SetContext(outboxkit.WithConsumer(context.Background(), "billing"))
	err := e.heldUntilCancelled(t, "shipping", stack, d)
	if !errors.Is(err, middleware.ErrWrongConsumer) || !strings.Contains(err.Error(), `"billing"`) {
		t.Fatalf("held with %v; want ErrWrongConsumer naming the subscription's consumer", err)
	}
	if e.count(t, "inbox", "shipping", msg.UUID)+e.count(t, "dead_letters", "shipping", msg.UUID)+e.count(t, "effects", "shipping", msg.UUID) != 0 {
		t.Fatal("the message was recorded, applied or dead-lettered under the stack's consumer")
	}
	// The same message, stamped with the stack's own consumer, goes through.
	ok := delivery(msg)
	ok.SetContext(outboxkit.WithConsumer(context.Background(), "shipping"))
	if _, err := stack(ok); err != nil || e.count(t, "effects", "shipping", msg.UUID) != 1 {
		t.Fatalf("the message delivered for the stack's consumer: %v, %d effects", err, e.count(t, "effects", "shipping", msg.UUID))
	}
}

// On tables never migrated, CheckSchema says which version to migrate to, and a consumer holds its
// messages (no hot redelivery loop) with the same error.
func misconfiguredNotMigrated[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	env := h.Open(t) // not migrated
	err := env.Store.CheckSchema(context.Background())
	if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "needs version") {
		t.Fatalf("CheckSchema on an empty schema: %v; want ErrNotMigrated naming the version needed", err)
	}
	e := &consumerEnv[TTx]{Env: env, reg: prometheus.NewRegistry(), now: time.Now}
	var runs atomic.Int32
	stack := e.stack(t, "shipping", func(*message.Message) error { runs.Add(1); return nil }, func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	err = e.heldUntilCancelled(t, "shipping", stack, delivery(orderMsg("o-1")))
	if !errors.Is(err, store.ErrNotMigrated) || runs.Load() != 0 {
		t.Fatalf("held with %v after %d handler runs; want ErrNotMigrated and no run", err, runs.Load())
	}
	if _, err := env.Store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.CheckSchema(context.Background()); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
}
