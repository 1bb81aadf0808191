package storetest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

func deadLetterUndecodable[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var handled atomic.Int32
	hf := func(m *message.Message) error { handled.Add(1); return e.effect("shipping")(m) }
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3 })
	poison := message.NewMessage("poison-1", []byte("not json"))
	if n := redeliverUntilAcked(t, stack, poison, 10); n != 1 {
		t.Fatalf("the poison took %d deliveries; a permanent error must be dead-lettered on the first", n)
	}
	if handled.Load() != 1 {
		t.Fatalf("the handler ran %d times; a permanent error must not be retried", handled.Load())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})
	if len(letters) != 1 || letters[0].MessageID != "poison-1" || string(letters[0].Payload) != "not json" ||
		!strings.Contains(letters[0].Reason, "decode") || letters[0].Attempts != 1 {
		t.Fatalf("dead letters = %+v; want the poison as received, with the decode error", letters)
	}
	e.assertGoodMessagesFlow(t, stack, 100)
}

func deadLetterTransient[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var attempts atomic.Int32
	failing := "always-failing"
	hf := func(m *message.Message) error {
		if m.UUID == failing {
			attempts.Add(1)
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = 2 })
	msg := message.NewMessage(failing, []byte(`{"id":"o-1"}`))
	if n := redeliverUntilAcked(t, stack, msg, 10); n != 3 {
		t.Fatalf("dead-lettered after %d deliveries, want exactly MaxDeliveries = 3", n)
	}
	if attempts.Load() != 9 {
		t.Fatalf("handler ran %d times, want 3 deliveries × (1 + 2 retries) = 9", attempts.Load())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{failing}})
	if len(letters) != 1 || letters[0].Attempts != 3 || !strings.Contains(letters[0].Reason, errTransient.Error()) {
		t.Fatalf("dead letters = %+v", letters)
	}
	e.assertGoodMessagesFlow(t, stack, 100)
}

// With a poison topic, a dead-lettered message also goes there through Watermill's PoisonQueue, as
// received and with its metadata; the table keeps it for replay as well. A message that is merely
// retried never reaches the poison topic.
func deadLetterPoisonTopic[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	poisoned, err := bus.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	var failOnce atomic.Bool
	failOnce.Store(true)
	hf := func(m *message.Message) error {
		if m.UUID == "flaky" && failOnce.CompareAndSwap(true, false) {
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) {
		c.DeadLetterPublisher, c.DeadLetterTopic, c.MaxRetries = bus, "poison", -1
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
		t.Fatalf("%s reached the poison topic too; only dead-lettered messages belong there", m.UUID)
	case <-time.After(100 * time.Millisecond):
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"}); len(letters) != 1 || letters[0].MessageID != "poison-1" {
		t.Fatalf("dead letters = %+v; the table keeps the dead-lettered message too", letters)
	}
}

// A message without an id (another producer's) cannot be deduplicated: it is dead-lettered on its
// first delivery, showing that delivery, and two different ones are kept apart.
func messageWithoutID[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"))
	for _, payload := range []string{`{"id":"a"}`, `{"id":"b"}`} {
		if _, err := stack(message.NewMessage("", []byte(payload))); err != nil {
			t.Fatalf("a message without an id: %v; want it dead-lettered and acknowledged", err)
		}
	}
	letters, err := e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 2 {
		t.Fatalf("%d dead letters for two different messages without an id, want 2: %+v", len(letters), letters)
	}
	for _, l := range letters {
		if l.Attempts != 1 || !strings.HasPrefix(l.MessageID, "no-id:") || !strings.Contains(l.Reason, "has no UUID") {
			t.Fatalf("dead letter %+v; want 1 delivery, a no-id: id and the reason", l)
		}
	}

	// One its subscriber could not read (brokerio.Undecodable): dead-lettered with the subscriber's
	// reason, the handler never run.
	bad := message.NewMessage("", []byte(`{"id":"c"}`))
	bad.Metadata.Set(outboxkit.MetadataUndecodable, "cannot read Redis stream entry 1-0 of orders: bad metadata")
	if _, err := stack(bad); err != nil {
		t.Fatalf("a message its subscriber could not read: %v; want it dead-lettered and acknowledged", err)
	}
	letters, err = e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping", ReasonContains: "stream entry 1-0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || !strings.HasPrefix(letters[0].MessageID, "no-id:") || !strings.Contains(letters[0].Reason, "bad metadata") ||
		!strings.Contains(letters[0].Reason, "fix its producer") || string(letters[0].Payload) != `{"id":"c"}` {
		t.Fatalf("dead letters %+v; want the message as it came, under a no-id: id, with the subscriber's reason", letters)
	}
}
