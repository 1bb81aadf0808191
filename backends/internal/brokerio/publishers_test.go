package brokerio

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// blockingPublisher takes no context: Publish returns only when released.
type blockingPublisher struct{ release chan struct{} }

func (p blockingPublisher) Publish(string, ...*message.Message) error { <-p.release; return nil }
func (p blockingPublisher) Close() error                              { return nil }

func TestBoundedPublisher_ReturnsAtTheDeadlineAndCloseWaits(t *testing.T) {
	inner := blockingPublisher{release: make(chan struct{})}
	p := &BoundedPublisher{Publisher: inner, Classify: func(err error) error { return err }}
	msg := message.NewMessage("m1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	msg.SetContext(ctx)
	err := p.Publish("orders", msg) // returns only through the deadline: the inner call never does
	if !outboxkit.IsUnreachable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish past its deadline returned %v, want an unreachable error wrapping the deadline", err)
	}
	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while an abandoned publish was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(inner.release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the abandoned publish ended")
	}
}
