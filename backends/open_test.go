package backends

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"

	"github.com/outboxkit/outboxkit"
)

func TestPgTable_LongTopicsDoNotShareATable(t *testing.T) {
	if got := pgTable("watermill_", "orders.placed"); got != `"watermill_orders.placed"` {
		t.Errorf("a short topic's table is %s, want watermill-sql's own name", got)
	}
	long := strings.Repeat("x", 60)
	a, b := pgTable("watermill_offsets_", long+"-1"), pgTable("watermill_offsets_", long+"-2")
	if a == b {
		t.Errorf("two topics that differ after 63 bytes share the table %s", a)
	}
	for _, n := range []string{a, b} {
		if len(n)-2 > 63 {
			t.Errorf("%s is longer than Postgres's 63-byte identifiers: it would be cut", n)
		}
	}
}

func TestClassifyKafka_OutageIsTransportRefusalIsNot(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("cannot produce message 0192: %w", err) }
	for _, err := range []error{
		wrap(breaker.ErrBreakerOpen), // Sarama's breaker, seen during an outage
		wrap(sarama.ErrOutOfBrokers), wrap(io.EOF), wrap(syscall.ECONNRESET),
		wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		wrap(sarama.ErrNotLeaderForPartition),
	} {
		if !outboxkit.IsTransport(classifyKafka(err)) {
			t.Errorf("%v: a message error, want a transport error (the broker is unreachable)", err)
		}
	}
	for _, err := range []error{wrap(sarama.ErrMessageSizeTooLarge), wrap(sarama.ErrInvalidTopic), errors.New("marshal: bad key")} {
		if outboxkit.IsTransport(classifyKafka(err)) {
			t.Errorf("%v: a transport error, want a message error (the message is refused)", err)
		}
	}
}

// blockingPublisher takes no context: Publish returns only when released.
type blockingPublisher struct{ release chan struct{} }

func (p blockingPublisher) Publish(string, ...*message.Message) error { <-p.release; return nil }
func (p blockingPublisher) Close() error                              { return nil }

func TestBoundedPublisher_ReturnsAtTheDeadlineAndCloseWaits(t *testing.T) {
	inner := blockingPublisher{release: make(chan struct{})}
	p := &boundedPublisher{Publisher: inner, classify: func(err error) error { return err }}
	msg := message.NewMessage("m1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	msg.SetContext(ctx)
	err := p.Publish("orders", msg) // returns only through the deadline: the inner call never does
	if !outboxkit.IsTransport(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish past its deadline returned %v, want a transport error wrapping the deadline", err)
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
