// Package amqpbackend is outboxkit's RabbitMQ broker (AMQP 0-9-1): a publisher with pipelined
// publisher confirms, mandatory routing and per-consumer-group queues, and a subscriber that hands
// the batch consumer runs of messages. It registers amqp:// and amqps:// with backends.Open.
package amqpbackend

import (
	"context"
	"errors"
	"fmt"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// ErrUnroutable is returned (wrapped) when the broker could not route a message to any queue:
// nothing is bound to the topic's exchange. The message was not stored anywhere.
var ErrUnroutable = errors.New("unroutable: no queue is bound to the exchange")

// declareGroupQueue declares the durable queue of group for topic ("<topic>_<group>", the name
// watermill-amqp's durable pub/sub gives it) and binds it to the topic's exchange.
func declareGroupQueue(ch *amqp.Channel, topic, group string, quorum bool) (string, error) {
	queue := wamqp.GenerateQueueNameTopicNameWithSuffix(group)(topic)
	var args amqp.Table
	if quorum {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return "", fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, "", topic, false, nil); err != nil {
		return "", fmt.Errorf("bind queue %s to %s: %w", queue, topic, err)
	}
	return queue, nil
}

func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	pub, err := NewPublisher(PublisherConfig{URL: rawURL, Logger: opts.Logger, Consumers: opts.Consumers,
		QuorumQueues: opts.QuorumQueues, ContentType: opts.ContentType, CloudEvents: opts.CloudEvents,
		CloudEventsSource: opts.CloudEventsSource})
	if err != nil {
		return backends.Parts{}, err
	}
	lag := &amqpLag{url: rawURL}
	return backends.Parts{
		Publisher: pub,
		Lag:       lag.read,
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			sub, err := NewSubscriber(SubscriberConfig{URL: rawURL, Consumer: group, Prefetch: opts.Prefetch, Unacked: opts.Unacked,
				QuorumQueues: opts.QuorumQueues, Logger: opts.Logger})
			if err != nil {
				return nil, err
			}
			return brokerio.NewRetryingSubscriber(sub, group, outboxkit.Unreachable, opts.Logger), nil
		},
		Close: []func() error{pub.Close, lag.close},
	}, nil
}

func init() {
	backends.Register(open, "amqp://user:pass@host:5672/vhost (RabbitMQ)", "amqp", "amqps")
}
