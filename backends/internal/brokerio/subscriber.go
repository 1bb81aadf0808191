package brokerio

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// subscribeRetry paces the attempts of a first Subscribe while the broker cannot be reached.
var subscribeRetry = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// RetryingSubscriber lets a consumer start while its broker is down. Subscribe tries once, and
// returns at once what that gives when the broker answers (so a message published after Subscribe
// returns is delivered), or any error that is not the broker's absence. When the broker could not
// be reached it returns a channel anyway and keeps trying in the background, with backoff, until
// the subscription is made or its context ends — as a lost connection is already resumed later.
// A router therefore keeps running through a broker outage at start.
type RetryingSubscriber struct {
	inner    Inner
	consumer string
	classify func(error) error // marks unreachable errors
	logger   watermill.LoggerAdapter
	outlets  Outlets
	wg       sync.WaitGroup
}

// Inner is what a broker library's subscriber offers.
type Inner interface {
	message.Subscriber
	message.SubscribeInitializer
}

// NewRetryingSubscriber wraps a library's subscriber for consumer; classify marks the errors that
// mean the broker could not be reached.
func NewRetryingSubscriber(inner Inner, consumer string, classify func(error) error, logger watermill.LoggerAdapter) *RetryingSubscriber {
	if classify == nil {
		classify = func(err error) error { return err }
	}
	if logger == nil {
		logger = logs.Default()
	}
	s := &RetryingSubscriber{inner: inner, consumer: consumer, classify: classify, logger: logger}
	s.outlets.Consumer = consumer
	s.outlets.Buffer = s.Unacked() - 1 // the one in the consumer's hands is not in the channel
	return s
}

// ReadingForeign makes the subscriber complete messages other producers wrote from their ce_*
// metadata (backends without a CloudEvents binding).
func (s *RetryingSubscriber) ReadingForeign() *RetryingSubscriber {
	s.outlets.Transform = func(msg *message.Message) {
		AdoptForeign(msg, MetadataAttrs(msg.Metadata, CEPrefixOther, ""))
	}
	return s
}

func (s *RetryingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.outlets.IsClosing() {
		return nil, errors.New("subscriber is closed")
	}
	in, err := s.inner.Subscribe(ctx, topic)
	if err == nil {
		return s.outlets.Outlet(ctx, in), nil
	}
	if err = s.classify(err); !outboxkit.IsUnreachable(err) {
		return nil, err
	}
	fields := watermill.LogFields{"topic": topic}
	s.logger.Error("Broker unreachable, subscribing in the background", err, fields)
	pending := make(chan (<-chan *message.Message), 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(pending)
		for attempt := 1; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-s.outlets.Closing():
				return
			case <-time.After(subscribeRetry.Delay(attempt)):
			}
			in, err := s.inner.Subscribe(ctx, topic)
			if err == nil {
				s.logger.Info("Subscribed after the broker came back", fields)
				pending <- in
				return
			}
			if err = s.classify(err); !outboxkit.IsUnreachable(err) {
				s.logger.Error("Cannot subscribe, giving up", err, fields)
				return
			}
		}
	}()
	return s.outlets.OutletLater(ctx, pending), nil
}

// Consumer names the consumer the subscriber reads for.
func (s *RetryingSubscriber) Consumer() string { return s.consumer }

// Unacked is how many messages a subscription hands out before the first is acknowledged: the
// library subscriber's, or 1 when it does not say.
func (s *RetryingSubscriber) Unacked() int {
	if u, ok := s.inner.(interface{ Unacked() int }); ok {
		return u.Unacked()
	}
	return 1
}

func (s *RetryingSubscriber) SubscribeInitialize(topic string) error {
	return s.inner.SubscribeInitialize(topic)
}

func (s *RetryingSubscriber) Close() error {
	return s.outlets.Close(func() error {
		s.wg.Wait() // no background attempt may subscribe after the inner subscriber is closed
		return s.inner.Close()
	})
}
