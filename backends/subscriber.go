package backends

import (
	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriber is a consumer group's subscriber: Watermill's Subscriber, and SubscribeInitialize,
// which creates what keeps a topic's messages for the group (RabbitMQ's queue, JetStream's durable
// consumer, Redis's consumer group, Kafka's topic, a watermill-sql topic's tables) before anything
// is consumed, so that nothing published from then on is missed.
type Subscriber interface {
	message.Subscriber
	message.SubscribeInitializer
}
