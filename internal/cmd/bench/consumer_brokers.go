package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/topics"
)

// brokerScheme is the scheme of a broker URL: amqp, nats, redis or kafka.
func brokerScheme(url string) string {
	scheme, _, _ := strings.Cut(url, "://")
	switch scheme {
	case "amqps":
		return "amqp"
	case "tls":
		return "nats"
	case "rediss":
		return "redis"
	}
	return scheme
}

// brokerSubscribers are the consumer scenario's subscribers on a broker other than RabbitMQ:
// outboxkit's, as backends.Open builds them, and the broker's stock Watermill subscriber.
type brokerSubscribers struct {
	url, scheme string
	backend     *backends.Backend
	closers     []func() error
}

// openBrokerSubscribers opens the broker; batching subscribers hand out consumerBatch messages
// before the first is acknowledged.
func openBrokerSubscribers(ctx context.Context, url string, batching bool) (*brokerSubscribers, error) {
	scheme := brokerScheme(url)
	if scheme != "nats" && scheme != "redis" && scheme != "kafka" {
		return nil, fmt.Errorf("--broker %s: the consumer scenario runs on amqp://, nats://, redis:// or kafka://", url)
	}
	opts := backends.Options{}
	if batching {
		opts.Unacked = consumerBatch
	}
	b, err := backends.Open(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	return &brokerSubscribers{url: url, scheme: scheme, backend: b}, nil
}

// stock is the broker's Watermill subscriber for group, as shipped but for what makes it read a
// topic outboxkit's publisher wrote from its start.
func (b *brokerSubscribers) stock(group string) (message.Subscriber, error) {
	logger := watermill.NopLogger{}
	switch b.scheme {
	case "nats":
		return wjs.NewSubscriber(wjs.SubscriberConfig{URL: b.url, Logger: logger, ResourceInitializer: wjs.GroupedConsumer(group)})
	case "redis":
		opts, err := redis.ParseURL(b.url)
		if err != nil {
			return nil, err
		}
		client := redis.NewClient(opts)
		b.closers = append(b.closers, client.Close)
		return redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: client, ConsumerGroup: group, OldestId: "0"}, logger)
	default:
		// watermill-kafka's subscriber is Sarama's, which the library's module does not require: a
		// service on Kafka compiles one Kafka client, franz-go. The integration module's tests read
		// outboxkit's records with it (TestKafka_StockWatermillSubscriberReadsWhatThePublisherWrote).
		return nil, fmt.Errorf("--broker %s: the stock Watermill subscriber is not compared on Kafka (watermill-kafka is Sarama's, not in this module): name the other kinds with --consumer-kinds", b.url)
	}
}

// close closes the broker and removes what the run made on it.
func (b *brokerSubscribers) close(names []string) {
	_ = b.backend.Close()
	for _, c := range b.closers {
		_ = c()
	}
	for _, t := range names {
		topics.Remove(b.url, b.scheme, t)
	}
}
