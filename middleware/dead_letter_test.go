package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
)

// redeliverUntilAcked plays the broker: the message is delivered again for as long as the stack
// returns an error, at most max times. It returns how many deliveries it took.
func redeliverUntilAcked(t *testing.T, stack message.HandlerFunc, msg *message.Message, max int) int {
	t.Helper()
	for n := 1; n <= max; n++ {
		if _, err := stack(delivery(msg)); err == nil {
			return n
		}
	}
	t.Fatalf("message %s still nacked after %d deliveries", msg.UUID, max)
	return 0
}

func TestDeadLetter_UndecodablePayloadIsQuarantinedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var handled atomic.Int32
	h := func(m *message.Message) error { handled.Add(1); return effect("shipping")(m) }
	stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) { c.MaxDeliveries = 3 })

	poison := message.NewMessage("poison-1", []byte("not json"))
	if n := redeliverUntilAcked(t, stack, poison, 10); n != 1 {
		t.Fatalf("the poison took %d deliveries; a permanent error must be quarantined on the first", n)
	}
	if handled.Load() != 1 {
		t.Fatalf("the handler ran %d times; a permanent error must not be retried", handled.Load())
	}
	letters := deadLetters(t, e, middleware.DeadLetterFilter{Consumer: "shipping"})
	if len(letters) != 1 || letters[0].MessageID != "poison-1" || string(letters[0].Payload) != "not json" ||
		!strings.Contains(letters[0].Reason, "decode") || letters[0].Deliveries != 1 {
		t.Fatalf("dead letters = %+v; want the poison as received, with the decode error", letters)
	}
	assertGoodMessagesFlow(t, e, stack, 100)
}

func TestDeadLetter_TransientFailureIsQuarantinedAfterMaxDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var attempts atomic.Int32
	failing := "always-failing"
	h := func(m *message.Message) error {
		if m.UUID == failing {
			attempts.Add(1)
			return errTransient
		}
		return effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = 2 })
	msg := message.NewMessage(failing, []byte(`{"id":"o-1"}`))
	if n := redeliverUntilAcked(t, stack, msg, 10); n != 3 {
		t.Fatalf("quarantined after %d deliveries, want exactly MaxDeliveries = 3", n)
	}
	if attempts.Load() != 9 {
		t.Fatalf("handler ran %d times, want 3 deliveries × (1 + 2 retries) = 9", attempts.Load())
	}
	letters := deadLetters(t, e, middleware.DeadLetterFilter{MessageIDs: []string{failing}})
	if len(letters) != 1 || letters[0].Deliveries != 3 || !strings.Contains(letters[0].Reason, errTransient.Error()) {
		t.Fatalf("dead letters = %+v", letters)
	}
	assertGoodMessagesFlow(t, e, stack, 100)
}

// assertGoodMessagesFlow processes n good messages through the same stack, each exactly once.
func assertGoodMessagesFlow(t *testing.T, e *env, stack message.HandlerFunc, n int) {
	t.Helper()
	before := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.effects`)
	for i := 0; i < n; i++ {
		if _, err := stack(delivery(orderMsg("good"))); err != nil {
			t.Fatalf("good message %d failed: %v", i, err)
		}
	}
	if got := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.effects`) - before; got != n {
		t.Fatalf("%d of %d good messages processed", got, n)
	}
}

func deadLetters(t *testing.T, e *env, f middleware.DeadLetterFilter) []middleware.DeadLetter {
	t.Helper()
	letters, err := middleware.ListDeadLetters(context.Background(), e.pg.Pool, string(e.pg.Schema), f)
	if err != nil {
		t.Fatal(err)
	}
	return letters
}

// A dead letter replayed after the cause is fixed is processed once; replayed again, it is a
// duplicate. Runs through a Watermill router over an in-memory broker.
func TestReplay_ProcessedOnceThenDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	var broken atomic.Bool
	broken.Store(true)
	h := func(m *message.Message) error {
		if broken.Load() {
			return errors.New("customer record missing")
		}
		return effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) { c.MaxDeliveries = 2; c.MaxRetries = -1 })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("shipping", "orders", bus, func(m *message.Message) error {
		_, err := stack(m)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-router.Running()

	msg := orderMsg("o-1")
	if err := bus.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the message to be dead-lettered", func() bool {
		return len(deadLetters(t, e, middleware.DeadLetterFilter{Consumer: "shipping"})) == 1
	})
	letter := deadLetters(t, e, middleware.DeadLetterFilter{Consumer: "shipping"})[0]
	if letter.Topic != "orders" || letter.Deliveries != 2 {
		t.Fatalf("dead letter = %+v; want topic orders after 2 deliveries", letter)
	}

	broken.Store(false) // the cause is fixed
	replay := middleware.ReplayConfig{Pool: e.pg.Pool, Schema: string(e.pg.Schema), Publisher: bus}
	if _, err := middleware.ReplayDeadLetters(ctx, replay, middleware.DeadLetterFilter{}); err == nil {
		t.Fatal("an empty filter replayed; it must demand a selection or All")
	}
	replayed, err := middleware.ReplayDeadLetters(ctx, replay, middleware.DeadLetterFilter{IDs: []int64{letter.ID}})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay = %v, %v", replayed, err)
	}
	testenv.Eventually(t, 10*time.Second, "the replayed message to be processed", func() bool {
		return e.count(t, "effects", "shipping", msg.UUID) == 1
	})
	if left := deadLetters(t, e, middleware.DeadLetterFilter{Consumer: "shipping"}); len(left) != 0 {
		t.Fatalf("%d dead letters still waiting after the replay", len(left))
	}

	// Replayed again (an operator's second try): absorbed by the inbox.
	again, err := middleware.ReplayDeadLetters(ctx, replay, middleware.DeadLetterFilter{IDs: []int64{letter.ID}, IncludeReplayed: true})
	if err != nil || len(again) != 1 {
		t.Fatalf("second replay = %v, %v", again, err)
	}
	testenv.Eventually(t, 10*time.Second, "the second replay to be counted as a duplicate", func() bool {
		return e.outcome(t, "shipping", "duplicate") == 1
	})
	if n := e.count(t, "effects", "shipping", msg.UUID); n != 1 {
		t.Fatalf("%d effects after two replays, want 1", n)
	}
}

// With a poison topic, a quarantined message also goes there through Watermill's PoisonQueue, as
// received and with its metadata (reason_poisoned and the rest); the table keeps it for replay as
// well. A message that is merely retried never reaches the poison topic.
func TestDeadLetter_PoisonTopicThroughWatermillsPoisonQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	poisoned, err := bus.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	var failOnce atomic.Bool
	failOnce.Store(true)
	h := func(m *message.Message) error {
		if m.UUID == "flaky" && failOnce.CompareAndSwap(true, false) {
			return errTransient
		}
		return effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) {
		c.PoisonPublisher, c.PoisonTopic, c.MaxRetries = bus, "poison", -1
	})
	redeliverUntilAcked(t, stack, message.NewMessage("flaky", []byte(`{"id":"f"}`)), 3)
	poison := message.NewMessage("poison-1", []byte("not json"))
	poison.Metadata.Set("origin", "test")
	if n := redeliverUntilAcked(t, stack, poison, 3); n != 1 {
		t.Fatalf("the poison took %d deliveries", n)
	}
	select {
	case m := <-poisoned:
		if m.UUID != "poison-1" || string(m.Payload) != "not json" || m.Metadata.Get("origin") != "test" ||
			!strings.Contains(m.Metadata.Get(wmiddleware.ReasonForPoisonedKey), "decode") {
			t.Fatalf("poison topic got %s %q %v", m.UUID, m.Payload, m.Metadata)
		}
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing reached the poison topic")
	}
	select {
	case m := <-poisoned:
		t.Fatalf("%s reached the poison topic too; only quarantined messages belong there", m.UUID)
	case <-time.After(100 * time.Millisecond):
	}
	if letters := deadLetters(t, e, middleware.DeadLetterFilter{Consumer: "shipping"}); len(letters) != 1 || letters[0].MessageID != "poison-1" {
		t.Fatalf("dead letters = %+v; the table keeps the quarantined message too", letters)
	}
}
