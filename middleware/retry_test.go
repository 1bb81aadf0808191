package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
)

func TestRetry(t *testing.T) {
	t.Parallel()
	backoff := outboxkit.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond, Multiplier: 2}
	retry, err := middleware.NewRetry(middleware.RetryConfig{MaxRetries: 4, Backoff: backoff})
	if err != nil {
		t.Fatal(err)
	}
	run := func(fail func(call int) error) (calls int, gaps []time.Duration, err error) {
		var last time.Time
		_, err = retry(func(*message.Message) ([]*message.Message, error) {
			calls++
			if !last.IsZero() {
				gaps = append(gaps, time.Since(last))
			}
			last = time.Now()
			return nil, fail(calls)
		})(message.NewMessage("m", nil))
		return calls, gaps, err
	}

	calls, gaps, err := run(func(int) error { return errTransient })
	if calls != 5 || !errors.Is(err, errTransient) {
		t.Fatalf("always failing: %d calls, err %v; want 1 + 4 retries and the error out", calls, err)
	}
	// Waits of 10, 20, 40, 40 ms: growing, then capped. Each gap is at least its wait.
	for i, want := range []time.Duration{10, 20, 40, 40} {
		if gaps[i] < want*time.Millisecond {
			t.Fatalf("retry %d came after %s, want at least %dms (gaps %v)", i+1, gaps[i], want, gaps)
		}
	}
	if gaps[2] < 35*time.Millisecond {
		t.Fatalf("the interval did not grow: gaps %v", gaps)
	}

	calls, _, err = run(func(c int) error {
		if c < 3 {
			return errTransient
		}
		return nil
	})
	if calls != 3 || err != nil {
		t.Fatalf("failing twice: %d calls, err %v; want success on the third", calls, err)
	}
	calls, _, err = run(func(int) error { return handlers.Permanent(errTransient) })
	if calls != 1 || !handlers.IsPermanent(err) {
		t.Fatalf("permanent error: %d calls; it must not be retried", calls)
	}

	// A retry waits in the handler; an ending message context cuts the wait short.
	ctx, cancel := context.WithCancel(context.Background())
	msg := message.NewMessage("m", nil)
	msg.SetContext(ctx)
	slow, _ := middleware.NewRetry(middleware.RetryConfig{MaxRetries: 3, Backoff: outboxkit.Backoff{Initial: time.Hour, Max: time.Hour, Multiplier: 1}})
	start := time.Now()
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := slow(func(*message.Message) ([]*message.Message, error) { return nil, errTransient })(msg); !errors.Is(err, errTransient) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("the retry wait ignored the cancelled context")
	}
}

func TestRetryConfigRefusesSilentZeros(t *testing.T) {
	_, err := middleware.NewRetry(middleware.RetryConfig{Backoff: outboxkit.Backoff{Initial: time.Second, Multiplier: 2}})
	if err == nil {
		t.Fatal("a Backoff without Max was accepted")
	}
}
