package backends

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// Subscriber is a consumer group's subscriber: Watermill's Subscriber, and SubscribeInitialize,
// which creates what keeps a topic's messages for the group (RabbitMQ's queue, JetStream's durable
// consumer, Redis's consumer group, Kafka's topic, a watermill-sql topic's tables) before anything
// is consumed, so that nothing published from then on is missed.
type Subscriber interface {
	message.Subscriber
	message.SubscribeInitializer
}

// subscribeRetry paces the attempts of a first Subscribe while the broker cannot be reached.
var subscribeRetry = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// retryingSubscriber lets a consumer start while its broker is down. Subscribe tries once, and
// returns at once what that gives when the broker answers (so a message published after Subscribe
// returns is delivered), or any error that is not the broker's absence. When the broker could not
// be reached it returns a channel anyway and keeps trying in the background, with backoff, until
// the subscription is made or its context ends — as a lost connection is already resumed later.
// A router therefore keeps running through a broker outage at start.
type retryingSubscriber struct {
	inner    Subscriber
	classify func(error) error // marks transport errors
	logger   watermill.LoggerAdapter
	outlets  outlets
	wg       sync.WaitGroup
}

func newRetryingSubscriber(inner Subscriber, classify func(error) error, logger watermill.LoggerAdapter) *retryingSubscriber {
	if classify == nil {
		classify = func(err error) error { return err }
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &retryingSubscriber{inner: inner, classify: classify, logger: logger}
}

// readingForeign makes the subscriber complete messages other producers wrote from their ce_*
// metadata (backends without a CloudEvents binding).
func (s *retryingSubscriber) readingForeign() *retryingSubscriber {
	s.outlets.transform = func(msg *message.Message) {
		adoptForeign(msg, metadataAttrs(msg.Metadata, cePrefixOther, ""))
	}
	return s
}

func (s *retryingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.outlets.isClosing() {
		return nil, errors.New("subscriber is closed")
	}
	in, err := s.inner.Subscribe(ctx, topic)
	if err == nil {
		return s.outlets.outlet(ctx, in), nil
	}
	if err = s.classify(err); !outboxkit.IsTransport(err) {
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
			case <-s.outlets.closingCh():
				return
			case <-time.After(subscribeRetry.Delay(attempt)):
			}
			in, err := s.inner.Subscribe(ctx, topic)
			if err == nil {
				s.logger.Info("Subscribed after the broker came back", fields)
				pending <- in
				return
			}
			if err = s.classify(err); !outboxkit.IsTransport(err) {
				s.logger.Error("Cannot subscribe, giving up", err, fields)
				return
			}
		}
	}()
	return s.outlets.outletLater(ctx, pending), nil
}

func (s *retryingSubscriber) SubscribeInitialize(topic string) error {
	return s.inner.SubscribeInitialize(topic)
}

func (s *retryingSubscriber) Close() error {
	return s.outlets.close(func() error {
		s.wg.Wait() // no background attempt may subscribe after the inner subscriber is closed
		return s.inner.Close()
	})
}
