package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// DefaultMaxRetries is how many times a failed message is retried in-process.
const DefaultMaxRetries = 3

// DefaultRetryBackoff spaces in-process retries: 100ms, 200ms, 400ms … capped at 2s, each ±20%.
var DefaultRetryBackoff = outboxkit.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Multiplier: 2, Jitter: 0.2}

// RetryConfig configures NewRetry.
type RetryConfig struct {
	// MaxRetries is how many times a failed message is retried in-process before the error goes
	// out (to the dead-letter middleware, then the broker). Default DefaultMaxRetries (3). Set -1
	// for none.
	MaxRetries int
	// Backoff spaces the retries; its interval grows up to Max, never a silent constant.
	// Default DefaultRetryBackoff.
	Backoff outboxkit.Backoff
	// IsUnreachable recognises failures to reach a dependency, which are left to the Circuit
	// further out instead of being retried here. Default IsUnreachable.
	IsUnreachable func(error) bool
	// Logger receives one line per retry. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

// retryable reports whether retrying in-process can help: not for permanent errors.
func retryable(err error) bool { return !handlers.IsPermanent(err) }

func (c RetryConfig) withDefaults() RetryConfig {
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.Backoff == (outboxkit.Backoff{}) {
		c.Backoff = DefaultRetryBackoff
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	if c.IsUnreachable == nil {
		c.IsUnreachable = outboxkit.IsUnreachable
	}
	return c
}

func (c RetryConfig) validate() error {
	var errs []error
	if c.MaxRetries < -1 {
		errs = append(errs, fmt.Errorf("field MaxRetries must be -1 (none) or more, got %d", c.MaxRetries))
	}
	return errors.Join(append(errs, c.Backoff.Validate("Backoff"))...)
}

// NewRetry retries a failed message in-process with exponential backoff and jitter. Permanent
// errors (handlers.Permanent) are not retried. A retry waits in the handler, so it holds back the
// messages behind it on the same subscription: keep MaxRetries × Backoff short and leave longer
// waits to redelivery.
//
// It is written here rather than taken from Watermill because Watermill's Retry advances its
// backoff whenever its ShouldRetry or OnRetryHook asks for the delay, so intervals grow faster
// than configured, and a zero MaxInterval silently keeps the interval constant.
func NewRetry(cfg RetryConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("retry config: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			for retry := 1; err != nil && retry <= cfg.MaxRetries && retryable(err) && !held(cfg.IsUnreachable, err); retry++ {
				wait := cfg.Backoff.Delay(retry)
				cfg.Logger.Debug("Retrying message", watermill.LogFields{
					"message_uuid": msg.UUID, "retry": retry, "wait": wait, "error": err.Error(),
				})
				timer := time.NewTimer(wait)
				select {
				case <-msg.Context().Done():
					timer.Stop()
					return out, err
				case <-timer.C:
				}
				out, err = h(msg)
			}
			return out, err
		}
	}, nil
}
