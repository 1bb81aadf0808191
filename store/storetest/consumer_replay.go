package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// A dead letter replayed after the cause is fixed is processed once; replayed again, it is a
// duplicate. Runs through a Watermill router over an in-memory broker.
func replayOnceThenDuplicate[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	var broken atomic.Bool
	broken.Store(true)
	hf := func(m *message.Message) error {
		if broken.Load() {
			return errors.New("customer record missing")
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 2; c.MaxRetries = -1 })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("shipping", "orders", bus, func(m *message.Message) error {
		_, err := stack(m)
		return err
	})
	defer runRouter(t, router)()
	ctx := context.Background()

	msg := orderMsg("o-1")
	if err := bus.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return len(e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})) == 1 }) {
		t.Fatal("the message was not dead-lettered")
	}
	letter := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})[0]
	if letter.Topic != "orders" || letter.Attempts != 2 {
		t.Fatalf("dead letter = %+v; want topic orders after 2 deliveries", letter)
	}
	broken.Store(false) // the cause is fixed
	replay := middleware.ReplayConfig{Store: e.Store, Publisher: bus}
	if _, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{}); !errors.Is(err, store.ErrEmptyFilter) {
		t.Fatalf("an empty filter replayed (%v); it must demand a selection or All", err)
	}
	replayed, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{IDs: []int64{letter.ID}})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay = %v, %v", replayed, err)
	}
	if !waitFor(10*time.Second, func() bool { return e.count(t, "effects", "shipping", msg.UUID) == 1 }) {
		t.Fatal("the replayed message was not processed")
	}
	if left := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"}); len(left) != 0 {
		t.Fatalf("%d dead letters still waiting after the replay", len(left))
	}
	// Replayed again (an operator's second try): absorbed by the inbox.
	again, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{IDs: []int64{letter.ID}, IncludeReplayed: true})
	if err != nil || len(again) != 1 {
		t.Fatalf("second replay = %v, %v", again, err)
	}
	if !waitFor(10*time.Second, func() bool { return e.outcome(t, "shipping", "duplicate") == 1 }) {
		t.Fatal("the second replay was not counted as a duplicate")
	}
	if n := e.count(t, "effects", "shipping", msg.UUID); n != 1 {
		t.Fatalf("%d effects after two replays, want 1", n)
	}
}
