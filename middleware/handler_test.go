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

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
)

// A stack built for another consumer than its subscription's held every message for ever, with an
// error per probe and nothing at start. AddConsumerHandler refuses the pair before the router
// runs, and says what to change; nothing is added to the router.
func TestAddConsumerHandler_RefusesASubscriberOfAnotherConsumerAtOnce(t *testing.T) {
	st := migratedSQLite(t)
	broker, err := backends.Open(context.Background(), "memory://", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	sub, err := broker.NewSubscriber("soak_billing")
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Never run: a router that did not run is left to the collector (its Close waits for
	// handlers that never started, for CloseTimeout).
	h, err := middleware.AddConsumerHandler(router, "billing", "orders", sub,
		middleware.StackConfig{Store: st, Consumer: "billing"}, func(*message.Message) error { return nil })
	if !errors.Is(err, middleware.ErrWrongConsumer) || h != nil {
		t.Fatalf("got handler %v, error %v; want ErrWrongConsumer and no handler", h, err)
	}
	for _, want := range []string{`"soak_billing"`, `"billing"`, "same name", `NewSubscriber("billing")`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %s", err, want)
		}
	}
	if n := len(router.Handlers()); n != 0 {
		t.Fatalf("the router holds %d handlers after a refusal", n)
	}

	_, err = middleware.AddConsumerHandler(router, "billing", "orders", sub,
		middleware.StackConfig{Store: st, Consumer: "Billing Service!"}, func(*message.Message) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "soak_billing") {
		t.Fatalf("an invalid consumer name with a subscriber of another: %v", err)
	}
	_, err = middleware.AddConsumerHandler(router, "billing", "orders", sub,
		middleware.StackConfig{Consumer: "soak_billing"}, func(*message.Message) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "field Store is required") {
		t.Fatalf("a stack without a store: %v", err)
	}
}

// With the names matching, the handler runs behind the stack: a message published twice is applied
// once, so the stack is there and not merely validated.
func TestAddConsumerHandler_RunsTheHandlerBehindTheStack(t *testing.T) {
	st := migratedSQLite(t)
	broker, err := backends.Open(context.Background(), "memory://", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	sub, err := broker.NewSubscriber("billing")
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan string, 4)
	if _, err := middleware.AddConsumerHandler(router, "billing", "orders", sub,
		middleware.StackConfig{Store: st, Consumer: "billing", MaxRetries: -1}, func(m *message.Message) error {
			applied <- m.UUID
			return nil
		}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-router.Running()
	msg := pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{}`))
	if err := broker.Publisher.Publish("orders", msg, msg.Copy()); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool {
		stats, err := middleware.Stats(context.Background(), st)
		return err == nil && len(stats) == 1 && stats[0].Processed == 1 && stats[0].Duplicates == 1
	}) {
		stats, err := middleware.Stats(context.Background(), st)
		t.Fatalf("the two deliveries were not both handled within 10s: %+v %v", stats, err)
	}
	if got := len(applied); got != 1 {
		t.Fatalf("the handler ran %d times for one message delivered twice", got)
	}
}

// A subscriber that does not name its consumer (Watermill's own) is taken as it is.
func TestAddConsumerHandler_TakesASubscriberThatNamesNoConsumer(t *testing.T) {
	st := migratedSQLite(t)
	bus := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer bus.Close()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Never run: a router that did not run is left to the collector (its Close waits for
	// handlers that never started, for CloseTimeout).
	if _, err := middleware.AddConsumerHandler(router, "billing", "orders", bus,
		middleware.StackConfig{Store: st, Consumer: "billing"}, func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := router.Handlers()["billing"]; !ok {
		t.Fatal("the handler was not added")
	}
}
