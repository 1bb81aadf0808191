package brokerio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/urls"
)

// ConsumersOf returns the consumers declared for topic, those of "*" included.
func ConsumersOf(consumers map[string][]string, topic string) []string {
	groups := append([]string(nil), consumers["*"]...)
	for _, g := range consumers[topic] {
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	return groups
}

// Checker is a publisher that can tell, before it publishes, whether the broker answers and accepts
// its credentials (the forwarder calls it at start).
type Checker interface {
	Check(ctx context.Context) error
}

// check runs inner's Check when it has one, with errors classified.
func check(ctx context.Context, inner any, classify func(error) error) error {
	if c, ok := inner.(Checker); ok {
		if err := c.Check(ctx); err != nil {
			return classify(err)
		}
	}
	return nil
}

// ClassifyingPublisher marks a publisher's errors as unreachable or message errors at the seam.
type ClassifyingPublisher struct {
	message.Publisher
	Classify func(error) error
	// Ping, when set, is Check: it asks the broker whether it answers and accepts the client.
	Ping func(ctx context.Context) error
}

// Check asks the broker (Ping, or the inner publisher's Check) whether it answers and accepts the
// client.
func (p ClassifyingPublisher) Check(ctx context.Context) error {
	if p.Ping != nil {
		return p.Classify(p.Ping(ctx))
	}
	return check(ctx, p.Publisher, p.Classify)
}

func (p ClassifyingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return p.Classify(err)
	}
	return nil
}

// BoundedPublisher returns from Publish when the first message's context ends, for clients whose
// publish takes no context (Sarama's SyncProducer retries for as long as its own settings say,
// tens of seconds into an outage, and the forwarder's pass would wait with it). The abandoned call
// runs on until the client gives up; if it succeeds after all, the row is published again later
// and the inbox absorbs the duplicate. Close waits for such calls, so none outlives it.
type BoundedPublisher struct {
	message.Publisher
	Classify func(error) error
	// Ping, when set, is Check: it asks the broker whether it answers, without the publisher.
	Ping func(ctx context.Context) error
	wg   sync.WaitGroup
}

func (p *BoundedPublisher) Publish(topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	if len(msgs) > 0 {
		ctx = msgs[0].Context()
	}
	if ctx.Done() == nil {
		if err := p.Publisher.Publish(topic, msgs...); err != nil {
			return p.Classify(err)
		}
		return nil
	}
	done := make(chan error, 1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		done <- p.Publisher.Publish(topic, msgs...)
	}()
	select {
	case err := <-done:
		if err != nil {
			return p.Classify(err)
		}
		return nil
	case <-ctx.Done():
		return outboxkit.Unreachable(fmt.Errorf("publish to %s not acknowledged before its deadline: %w", topic, context.Cause(ctx)))
	}
}

// Check is Ping, or else the inner publisher's Check, classified.
func (p *BoundedPublisher) Check(ctx context.Context) error {
	if p.Ping != nil {
		return p.Classify(p.Ping(ctx))
	}
	return check(ctx, p.Publisher, p.Classify)
}

func (p *BoundedPublisher) Close() error {
	err := p.Publisher.Close()
	p.wg.Wait()
	return err
}

// LazyPublisher makes its publisher on the first Publish, and again on the next one after a
// failure, for clients that connect when they are made.
type LazyPublisher struct {
	Build  func() (message.Publisher, error)
	mu     sync.Mutex
	inner  message.Publisher
	closed bool
}

func (p *LazyPublisher) get() (message.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("publisher is closed")
	}
	if p.inner == nil {
		inner, err := p.Build()
		if err != nil {
			return nil, err
		}
		p.inner = inner
	}
	return p.inner, nil
}

func (p *LazyPublisher) Publish(topic string, msgs ...*message.Message) error {
	inner, err := p.get()
	if err != nil {
		return err
	}
	return inner.Publish(topic, msgs...)
}

// Check makes the publisher when it is not made yet (which dials, for the clients this wraps).
func (p *LazyPublisher) Check(ctx context.Context) error {
	inner, err := p.get()
	if err != nil {
		return err
	}
	return check(ctx, inner, func(err error) error { return err })
}

func (p *LazyPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.inner != nil {
		return p.inner.Close()
	}
	return nil
}

// Redact hides the password of a URL for error messages.
func Redact(raw string) string { return urls.Redact(raw) }

// AgeOf is the age of something the broker stamped at t, never negative.
func AgeOf(t time.Time) time.Duration { return max(0, time.Since(t)) }
