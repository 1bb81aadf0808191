package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// RabbitMQ: a consumer group that subscribes only after events were published (a new service, a
// consumer deployed after the producer) gets every one of them when the publisher was told the
// topic's groups. Without that, a fanout exchange with another group bound drops them for it, and
// mandatory publishing does not notice.
func TestAMQP_LateConsumerGroupGetsWhatWasPublishedBeforeIt(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "late") + ".placed"
	dropWhenDone(t, "amqp", url, []string{topic}, []string{"shipping", "billing"})
	b := openBackend(t, url, backends.Options{Consumers: map[string][]string{topic: {"shipping", "billing"}}})

	shipping, err := b.NewSubscriber("shipping")
	if err != nil {
		t.Fatal(err)
	}
	defer shipping.Close()
	early, err := shipping.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := 0; i < n; i++ {
		if err := b.Publisher.Publish(topic, pipeline.NewEvent("OrderPlaced", fmt.Sprint(i), []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	receive(t, early, n, "shipping")

	billing, err := b.NewSubscriber("billing") // the late group
	if err != nil {
		t.Fatal(err)
	}
	defer billing.Close()
	late, err := billing.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	receive(t, late, n, "billing, subscribed after the events were published,")
}

func receive(t *testing.T, ch <-chan *message.Message, n int, who string) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case m := <-ch:
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("%s received %d of %d messages", who, i, n)
		}
	}
}

// Every backend: a process starts while its broker is down. Open succeeds, a consumer's router
// starts and keeps running, and once the broker answers the consumer receives what is published.
func TestBackends_ConsumerStartsWhileTheBrokerIsDown(t *testing.T) {
	cases := []struct {
		scheme string
		proxy  func(t *testing.T) (*testenv.Proxy, string)
	}{
		{"amqp", func(t *testing.T) (*testenv.Proxy, string) { return testenv.ProxyURL(t, testenv.AMQPURL(t)) }},
		{"nats", func(t *testing.T) (*testenv.Proxy, string) { return testenv.ProxyURL(t, testenv.NATSURL(t)) }},
		{"redis", func(t *testing.T) (*testenv.Proxy, string) { return testenv.ProxyURL(t, testenv.RedisURL(t)) }},
		{"kafka", kafkaBehindProxy},
		{"postgres", func(t *testing.T) (*testenv.Proxy, string) { return testenv.ProxyURL(t, testenv.PostgresTopicURL(t)) }},
	}
	for _, c := range cases {
		t.Run(c.scheme, func(t *testing.T) {
			t.Parallel()
			proxy, url := c.proxy(t)
			topic := testenv.UniqueName(t, "down") + ".placed"
			dropWhenDone(t, c.scheme, url, []string{topic}, []string{"app"})
			proxy.Cut()

			b, err := backends.Open(context.Background(), url, backends.Options{})
			if err != nil {
				t.Fatalf("Open with the broker down: %v; a process must be able to start", err)
			}
			t.Cleanup(func() { _ = b.Close() })
			sub, err := b.NewSubscriber("app")
			if err != nil {
				t.Fatal(err)
			}
			// Subscribe hands out a channel at once, whatever the broker: a router's other handlers
			// must not wait behind it. (Its context would never end: a blocking Subscribe shows as
			// the whole minute.)
			sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
			start := time.Now()
			if _, err := sub.Subscribe(sctx, topic); err != nil {
				t.Fatalf("Subscribe with the broker down: %v", err)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("Subscribe with the broker down took %s; want a channel at once", took)
			}
			scancel()
			got := make(chan string, 10)
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			router.AddConsumerHandler("app", topic, sub, func(m *message.Message) error { got <- m.UUID; return nil })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- router.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("router: %v", err)
				}
				_ = sub.Close()
			})
			select {
			case <-router.Running():
			case err := <-done:
				done <- err // for the cleanup's wait
				t.Fatalf("the router stopped while the broker was down: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the router did not start while the broker was down")
			}

			proxy.Restore()
			msg := pipeline.NewEvent("OrderPlaced", "k", []byte(`{}`))
			testenv.Eventually(t, 60*time.Second, "a publish to succeed once the broker is back", func() bool {
				return b.Publisher.Publish(topic, msg) == nil
			})
			select {
			case id := <-got:
				if id != msg.UUID {
					t.Fatalf("got %s, want %s", id, msg.UUID)
				}
			case err := <-done:
				done <- err // for the cleanup's wait
				t.Fatalf("the router stopped: %v", err)
			case <-time.After(60 * time.Second):
				t.Fatal("the consumer that started while the broker was down never received the message")
			}
		})
	}
}
