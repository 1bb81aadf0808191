package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// QuorumQueues: the groups' queues are quorum queues — declared so by the publisher for the groups
// it was told of, and by the subscriber — and a message that is nacked comes back with RabbitMQ's
// x-delivery-count header (an integer), which the subscriber reads instead of failing on it.
func TestAMQP_QuorumQueues(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "quorum") + ".placed"
	dropWhenDone(t, "amqp", url, []string{topic}, []string{"billing"})
	b := openBackend(t, url, backends.Options{QuorumQueues: true, Consumers: map[string][]string{"*": {"billing"}}})
	msg := pipeline.NewEvent("OrderPlaced", "k", []byte(`{}`))
	if err := b.Publisher.Publish(topic, msg); err != nil { // declares the quorum queue first
		t.Fatal(err)
	}

	_, err := amqpChannel(t, url).QueueDeclare(topic+"_billing", true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("declaring the group's queue as classic: %v; want PRECONDITION_FAILED, the queue being a quorum queue", err)
	}

	sub, err := b.NewSubscriber("billing")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for delivery := 1; delivery <= 2; delivery++ {
		select {
		case m := <-msgs:
			if m.UUID != msg.UUID {
				t.Fatalf("got %s, want %s", m.UUID, msg.UUID)
			}
			if delivery == 1 {
				m.Nack()
				continue
			}
			if m.Metadata.Get("x-delivery-count") != "1" {
				t.Fatalf("redelivery metadata %v: want x-delivery-count 1 as a string", m.Metadata)
			}
			m.Ack()
		case <-time.After(15 * time.Second):
			t.Fatalf("delivery %d did not arrive", delivery)
		}
	}
}
