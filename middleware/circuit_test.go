package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
)

var fastCircuit = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}

func circuit(t *testing.T, h message.HandlerFunc) message.HandlerFunc {
	t.Helper()
	m, err := middleware.NewCircuit(middleware.CircuitConfig{Consumer: "shipping", Backoff: fastCircuit})
	if err != nil {
		t.Fatal(err)
	}
	return m(h)
}

// While the dependency is unreachable, messages are held (not returned, so not nacked) and one at
// a time probes it; when it answers, every held message goes through.
func TestCircuit_HoldsMessagesAndProbesOneAtATime(t *testing.T) {
	t.Parallel()
	var (
		down            atomic.Bool
		running, most   atomic.Int32
		calls, failures atomic.Int32
		release         = make(chan struct{})
	)
	down.Store(true)
	h := circuit(t, func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		if down.Load() {
			if failures.Add(1) > 3 {
				// From the fourth failure on the circuit is open: track how many run at once.
				for cur := most.Load(); n > cur && !most.CompareAndSwap(cur, n); cur = most.Load() {
				}
			}
			return nil, outboxkit.Unreachable(errors.New("connection refused"))
		}
		<-release
		return nil, nil
	})
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h(message.NewMessage("m", nil))
			errs <- err
		}()
	}
	if !waitFor(10*time.Second, func() bool { return failures.Load() >= 20 }) {
		t.Fatal("the circuit never probed again")
	}
	if m := most.Load(); m > 1 {
		t.Fatalf("%d handlers ran at once while the circuit was open; one probe at a time", m)
	}
	select {
	case err := <-errs:
		t.Fatalf("a message was returned (%v) while the dependency was down; it must be held", err)
	default:
	}
	down.Store(false)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a held message failed after the dependency came back: %v", err)
		}
	}
}

// A failure of the message itself goes straight through; the circuit stays closed.
func TestCircuit_MessageErrorsPassThrough(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	boom := errors.New("invalid order")
	h := circuit(t, func(msg *message.Message) ([]*message.Message, error) { calls.Add(1); return nil, boom })
	if _, err := h(message.NewMessage("m", nil)); !errors.Is(err, boom) || calls.Load() != 1 {
		t.Fatalf("err = %v after %d calls, want the handler's own error after one", err, calls.Load())
	}
}

// A held message whose context ends (shutdown) is returned with the last error, to be redelivered.
func TestCircuit_GivesUpWhenTheMessageContextEnds(t *testing.T) {
	t.Parallel()
	refused := outboxkit.Unreachable(errors.New("connection refused"))
	h := circuit(t, func(msg *message.Message) ([]*message.Message, error) { return nil, refused })
	msg := message.NewMessage("m", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	msg.SetContext(ctx)
	if _, err := h(msg); !errors.Is(err, refused) {
		t.Fatalf("err = %v, want the last unreachable error", err)
	}
}
