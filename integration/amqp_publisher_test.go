package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

func TestAMQPPublisher_ConfirmedPersistentWithMessageID(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "topic")
	q := testenv.BindQueue(t, url, topic)
	pub := amqpPublisher(t, url)

	msg := pipeline.NewEvent("OrderPlaced", "order-1", []byte(`{"id":1}`))
	if err := pub.Publish(topic, msg); err != nil {
		t.Fatal(err)
	}
	got := q.WaitFor(t, 1, 10*time.Second)[0]
	if got.MessageId != msg.UUID || got.DeliveryMode != amqp.Persistent || string(got.Body) != `{"id":1}` {
		t.Fatalf("delivery = id %q mode %d body %s; want the UUID as message_id, persistent", got.MessageId, got.DeliveryMode, got.Body)
	}
	if got.Headers[outboxkit.MetadataPartitionKey] != "order-1" || got.Headers["_watermill_message_uuid"] != msg.UUID {
		t.Fatalf("headers = %v; want metadata and watermill-amqp's UUID header", got.Headers)
	}
}

func TestAMQPPublisher_UnroutableIsAMessageError(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "nobody")
	t.Cleanup(func() { deleteExchange(t, url, topic) })
	err := amqpPublisher(t, url).Publish(topic, pipeline.NewEvent("E", "k", nil))
	if !errors.Is(err, amqpbackend.ErrUnroutable) || outboxkit.IsUnreachable(err) {
		t.Fatalf("got %v; want ErrUnroutable, not an unreachable error", err)
	}
}

func TestAMQPPublisher_ChannelExceptionIsAMessageError(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "direct")
	ch := amqpChannel(t, url)
	// The exchange exists with another type: declaring it as fanout is refused with 406.
	if err := ch.ExchangeDeclare(topic, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteExchange(t, url, topic) })
	pub := amqpPublisher(t, url)
	err := pub.Publish(topic, pipeline.NewEvent("E", "k", nil))
	if err == nil || outboxkit.IsUnreachable(err) {
		t.Fatalf("got %v; want a message error (the topic is misconfigured, the broker is fine)", err)
	}
	// The publisher keeps working for other topics.
	other := testenv.UniqueName(t, "ok")
	q := testenv.BindQueue(t, url, other)
	if err := pub.Publish(other, pipeline.NewEvent("E", "k", nil)); err != nil {
		t.Fatal(err)
	}
	q.WaitFor(t, 1, 10*time.Second)
}

func TestAMQPPublisher_BrokerGoneIsUnreachableAndRecovers(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	proxy, proxied := testenv.ProxyURL(t, url)
	topic := testenv.UniqueName(t, "topic")
	q := testenv.BindQueue(t, url, topic)
	pub := amqpPublisher(t, proxied)

	if err := pub.Publish(topic, pipeline.NewEvent("E", "k", nil)); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	msg := pipeline.NewEvent("E", "k", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg.SetContext(ctx)
	if err := pub.Publish(topic, msg); !outboxkit.IsUnreachable(err) {
		t.Fatalf("publish with the broker cut off: got %v, want an unreachable error", err)
	}
	proxy.Restore()
	testenv.Eventually(t, 20*time.Second, "the publisher to reconnect", func() bool {
		return pub.Publish(topic, pipeline.NewEvent("E", "k", nil)) == nil
	})
	q.WaitFor(t, 2, 10*time.Second)
}

// A broker that accepts the publish but never confirms it (a black hole on the network) is a
// unreachable once the message context's deadline passes.
func TestAMQPPublisher_MissingConfirmIsTransport(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	proxy, proxied := testenv.ProxyURL(t, url)
	topic := testenv.UniqueName(t, "topic")
	testenv.BindQueue(t, url, topic)
	pub := amqpPublisher(t, proxied)
	if err := pub.Publish(topic, pipeline.NewEvent("E", "k", nil)); err != nil {
		t.Fatal(err) // connection, channel and exchange are set up
	}
	proxy.Freeze()
	defer proxy.Thaw()
	msg := pipeline.NewEvent("E", "k", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	msg.SetContext(ctx)
	start := time.Now()
	err := pub.Publish(topic, msg)
	if !outboxkit.IsUnreachable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v; want an unreachable error for the missing confirm", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("publish returned after %s; the context deadline must bound the confirm wait", waited)
	}
}

func deleteExchange(t testing.TB, url, name string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		_ = ch.ExchangeDelete(name, false, false)
	}
}

// On a shared channel a channel exception nacks everything in flight, and the broker does not say
// which message it refused. A message alone on the channel is blamed; in a crowd nobody is, and no
// innocent message ever gets a message error (which would count an attempt against it).
func TestAMQPPublisher_ChannelExceptionBlamesOnlyAKnownCulprit(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	good := testenv.UniqueName(t, "good")
	gone := testenv.UniqueName(t, "gone")
	testenv.BindQueue(t, url, good)
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: url, Channels: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// Declare the doomed exchange through the publisher, then delete it behind its back: a publish
	// to it is refused with 404 and the broker closes the shared channel.
	if err := pub.Publish(gone, pipeline.NewEvent("E", "k", nil)); !errors.Is(err, amqpbackend.ErrUnroutable) {
		t.Fatalf("setup publish: %v", err)
	}
	deleteExchange(t, url, gone)

	if err := pub.Publish(gone, pipeline.NewEvent("E", "k", nil)); err == nil || outboxkit.IsUnreachable(err) {
		t.Fatalf("alone on the channel, the refused message got %v; want a message error", err)
	}
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 40)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				topic := good
				if i == 20 {
					topic = gone
				}
				errs[i] = pub.Publish(topic, pipeline.NewEvent("E", "k", nil))
			}()
		}
		wg.Wait()
		if errs[20] == nil {
			t.Fatalf("round %d: the publish to the deleted exchange succeeded", round)
		}
		for i, err := range errs {
			if i != 20 && err != nil && !outboxkit.IsUnreachable(err) {
				t.Fatalf("round %d: innocent message %d got a message error: %v", round, i, err)
			}
		}
	}
}
