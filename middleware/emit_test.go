package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
)

// What a handler returns goes into the outbox, in the inbox's transaction, to the handler's
// publish topic; the router itself publishes nothing. A handler that fails after returning
// messages leaves no outbox row.
func TestInbox_HandlerOutputGoesIntoTheOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	direct, err := bus.Subscribe(context.Background(), "invoices")
	if err != nil {
		t.Fatal(err)
	}
	stack, err := middleware.Stack(middleware.StackConfig{Pool: e.pg.Pool, Schema: string(e.pg.Schema), Consumer: "billing", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 10)
	h := router.AddHandler("billing", "orders", bus, "invoices", bus, func(msg *message.Message) ([]*message.Message, error) {
		defer func() { handled <- msg.UUID }()
		invoice := pipeline.NewEvent("InvoiceIssued", "inv-"+msg.UUID, []byte(`{}`))
		if string(msg.Payload) == `"fail after emitting"` {
			return []*message.Message{invoice}, handlers.Permanent(errors.New("the effect failed"))
		}
		return []*message.Message{invoice}, nil
	})
	h.AddMiddleware(stack...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-router.Running()

	ok, bad := message.NewMessage("m-ok", []byte(`{}`)), message.NewMessage("m-bad", []byte(`"fail after emitting"`))
	for _, m := range []*message.Message{ok, bad} {
		if err := bus.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		select {
		case <-handled:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %s was not handled", m.UUID)
		}
	}
	if !waitFor(10*time.Second, func() bool { return e.count(t, "dead_letters", "billing", "m-bad") == 1 }) {
		t.Fatal("the failing message was not quarantined")
	}
	if n := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE topic = 'invoices' AND partition_key = 'inv-m-ok'`); n != 1 {
		t.Fatalf("%d outbox rows for the returned message, want 1", n)
	}
	if n := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
		t.Fatalf("%d outbox rows in all, want 1: a failed handler's output must roll back with its effect", n)
	}
	select {
	case m := <-direct:
		t.Fatalf("the router published %s itself; it must go through the outbox only", m.UUID)
	default:
	}
}

// Outside a router that knows a publish topic, returned messages have nowhere to go: an error that
// says so, and nothing committed.
func TestInbox_HandlerOutputWithoutPublishTopicIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ms, err := middleware.Stack(middleware.StackConfig{Pool: e.pg.Pool, Schema: string(e.pg.Schema), Consumer: "billing", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	var h message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{pipeline.NewEvent("X", "k", nil)}, nil
	}
	for i := len(ms) - 1; i >= 0; i-- {
		h = ms[i](h)
	}
	msg := orderMsg("o-1")
	_, err = h(delivery(msg))
	if err == nil || !strings.Contains(err.Error(), "publish topic") {
		t.Fatalf("err = %v, want one naming the missing publish topic", err)
	}
	if e.count(t, "inbox", "billing", msg.UUID) != 0 || e.pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) != 0 {
		t.Fatal("something was committed")
	}
}
