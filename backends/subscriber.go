package backends

import (
	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriber is a consumer's subscriber: Watermill's Subscriber; SubscribeInitialize, which
// creates what keeps a topic's messages for the consumer (RabbitMQ's queue, JetStream's durable
// consumer, Redis's consumer group, Kafka's topic, a watermill-sql topic's tables) before anything
// is consumed, so that nothing published from then on is missed; and the consumer's name, which
// every message it hands out carries too (outboxkit.ConsumerFrom), so that a middleware stack built
// for another consumer says so.
type Subscriber interface {
	message.Subscriber
	message.SubscribeInitializer
	// Consumer names the consumer the subscriber reads for.
	Consumer() string
}
