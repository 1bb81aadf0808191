package outboxkit

import "context"

type consumerKey struct{}

// WithConsumer returns ctx naming the consumer a message was delivered to. outboxkit's subscribers
// (package backends) set it on every message they hand out, so that a middleware stack built for
// another consumer says so instead of recording the message under the wrong name.
func WithConsumer(ctx context.Context, consumer string) context.Context {
	return context.WithValue(ctx, consumerKey{}, consumer)
}

// ConsumerFrom returns the consumer a message was delivered to, when its subscriber said.
func ConsumerFrom(ctx context.Context) (consumer string, ok bool) {
	consumer, ok = ctx.Value(consumerKey{}).(string)
	return consumer, ok
}
