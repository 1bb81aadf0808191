package outboxkit

import "context"

type redeliveredKey struct{}

// WithRedelivered records on a delivery's context what the broker says of it: redelivered false
// means the broker vouches that it has not delivered this message to this consumer group before
// (RabbitMQ's redelivered flag, JetStream's delivery count, a Redis entry read as new, a Kafka record
// past the group's read horizon), true that it has, at least once. Subscribers that know set it;
// middleware.DeliveryCount then writes nothing for a first delivery that succeeds.
func WithRedelivered(ctx context.Context, redelivered bool) context.Context {
	return context.WithValue(ctx, redeliveredKey{}, redelivered)
}

// Redelivered returns what the subscriber recorded with WithRedelivered; known is false when it
// recorded nothing.
func Redelivered(ctx context.Context) (redelivered, known bool) {
	redelivered, known = ctx.Value(redeliveredKey{}).(bool)
	return redelivered, known
}
