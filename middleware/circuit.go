package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultCircuitBackoff spaces the probes of a consumer whose dependency is unreachable: 200ms,
// 400ms, 800ms … capped at 10 seconds, each ±20%.
var DefaultCircuitBackoff = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2, Jitter: 0.2}

// IsUnreachableIn is outboxkit.IsUnreachable that also recognises s's database failing to answer (a failed
// connect, a session cut, the server shutting down or starting up), in the store's own statements
// or the handler's: the default of every middleware given a Store, and of Stack.
func IsUnreachableIn(s store.Store) func(error) bool {
	if s == nil {
		return outboxkit.IsUnreachable
	}
	return func(err error) bool { return outboxkit.IsUnreachable(err) || s.IsUnreachable(err) }
}

// CircuitConfig configures NewCircuit.
type CircuitConfig struct {
	// Consumer names the consuming service in logs and metrics. Required.
	Consumer string
	// Backoff spaces the probes while a dependency is unreachable. Default DefaultCircuitBackoff.
	Backoff outboxkit.Backoff
	// IsUnreachable decides whether a failure means a dependency could not be reached. Default
	// IsUnreachable; Stack passes IsUnreachableIn(its Store).
	IsUnreachable func(error) bool
	// Metrics is told when the circuit changes state. Default: none.
	Metrics Metrics
	// Now is the clock the probe times are computed with. Default time.Now.
	Now func() time.Time
	// Logger receives a line when the circuit opens and when it closes. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

// NewCircuit meets an unreachable dependency — the consumer's database restarting, a payment
// gateway down — the way the forwarder meets an unreachable broker. When the handler fails because
// a dependency could not be reached, the circuit opens: the message is held, not nacked (a broker
// that redelivers a nacked message at once would turn every nack into another attempt), and it
// and every other message of the consumer wait. At the probe time one message tries again; while
// the dependency stays away the probes back off (Backoff); once one gets through the circuit
// closes and every waiting message goes on. Failures of the message itself pass through untouched.
//
// A consumer that is set up wrong is held the same way, with an error logged at every probe: a
// handler written for another transaction type than the store's (outboxkit.TxTypeError), a
// message its subscriber delivered for another consumer (ErrWrongConsumer), outboxkit's tables
// missing or migrated by a newer build (store.ErrNotMigrated, store.ErrNewerSchema). Such a fault
// is the program's, not the message's: nothing is dead-lettered or counted for it, and the messages
// go on once it is fixed.
//
// It belongs outside DeliveryCount (Stack puts it there), so a held message is delivered once
// however long it waits and the outage never counts toward MaxDeliveries. When the message's
// context ends while it waits (the subscriber or router is closing), the last error is returned
// and the broker redelivers the message later.
func NewCircuit(cfg CircuitConfig) (message.HandlerMiddleware, error) {
	var errs []error
	if !consumerName.MatchString(cfg.Consumer) {
		errs = append(errs, errors.New("field Consumer is required: name the consuming service"))
	}
	if cfg.Backoff == (outboxkit.Backoff{}) {
		cfg.Backoff = DefaultCircuitBackoff
	}
	errs = append(errs, cfg.Backoff.Validate("Backoff"))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("circuit config: %w", err)
	}
	if cfg.IsUnreachable == nil {
		cfg.IsUnreachable = outboxkit.IsUnreachable
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Default()
	}
	c := &consumerCircuit{backoff: cfg.Backoff, changed: make(chan struct{})}
	if cfg.Metrics != nil {
		c.metrics = cfg.Metrics
	}
	fields := watermill.LogFields{"consumer": cfg.Consumer}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			var lastErr error
			for {
				probe, err := c.enter(ctx, cfg.Now)
				if err != nil {
					if lastErr != nil {
						return nil, lastErr
					}
					return nil, fmt.Errorf("message %s waited for an unreachable dependency until: %w", msg.UUID, err)
				}
				var out []*message.Message
				err = checkConsumer(msg, cfg.Consumer)
				if err == nil {
					out, err = h(msg)
				}
				if ctx.Err() != nil {
					c.abandon(probe) // shutting down: no verdict on the dependency
					if err != nil && lastErr != nil {
						return out, lastErr // why the message was held
					}
					return out, err
				}
				if misconfigured(err) {
					// Nothing the message did: it waits, with every other message of the consumer,
					// and the fault is said loudly at every probe until it is fixed.
					lastErr = err
					retryAt, _ := c.fail(cfg.Now(), probe)
					cfg.Logger.Error("The consumer is misconfigured: every message waits until it is fixed", err,
						fields.Add(watermill.LogFields{"message_uuid": msg.UUID, "retry_at": retryAt}))
					continue
				}
				if err != nil && cfg.IsUnreachable(err) {
					lastErr = err
					if retryAt, opened := c.fail(cfg.Now(), probe); opened {
						cfg.Logger.Error("A dependency is unreachable, consumer circuit open", err,
							fields.Add(watermill.LogFields{"message_uuid": msg.UUID, "retry_at": retryAt}))
					}
					continue
				}
				if c.succeed() {
					cfg.Logger.Info("Dependency reachable again, consumer circuit closed", fields)
				}
				return out, err
			}
		}
	}, nil
}

// consumerCircuit is shared by every message of one consumer. Like the forwarder's circuit it is
// hand-rolled: it reads the injected clock and backs its probes off exponentially.
type consumerCircuit struct {
	backoff outboxkit.Backoff
	metrics Metrics

	mu        sync.Mutex
	failures  int // consecutive failed probes; 0 = closed
	openUntil time.Time
	probing   bool
	changed   chan struct{} // closed and replaced on every change, to wake the waiters
}

// enter waits until the caller may run the handler: at once while the circuit is closed; while it
// is open, until the probe time, when exactly one caller probes (probe = true) and the others wait
// for its verdict.
func (c *consumerCircuit) enter(ctx context.Context, now func() time.Time) (probe bool, err error) {
	for {
		c.mu.Lock()
		if c.failures == 0 {
			c.mu.Unlock()
			return false, nil
		}
		wait := c.openUntil.Sub(now())
		if wait <= 0 && !c.probing {
			c.probing = true
			c.setState(CircuitProbing)
			c.mu.Unlock()
			return true, nil
		}
		changed := c.changed
		c.mu.Unlock()
		var timer *time.Timer
		var timeout <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			timeout = timer.C
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-changed:
		case <-timeout:
		}
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			return false, err
		}
	}
}

// fail records that a dependency was unreachable. Only a probe, or the first failure while the
// circuit was closed, moves the probe time: the messages that were already running when it opened
// fail together and must not count as several probes.
func (c *consumerCircuit) fail(now time.Time, probe bool) (retryAt time.Time, opened bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if probe || c.failures == 0 {
		opened = c.failures == 0
		c.failures++
		c.openUntil = now.Add(c.backoff.Delay(c.failures))
	}
	if probe {
		c.probing = false
	}
	c.setState(CircuitOpen)
	c.signal()
	return c.openUntil, opened
}

// succeed closes the circuit: the handler got through (whatever it said about the message).
func (c *consumerCircuit) succeed() (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failures == 0 {
		return false
	}
	c.failures, c.probing = 0, false
	c.setState(CircuitClosed)
	c.signal()
	return true
}

// abandon gives the probe back without a verdict.
func (c *consumerCircuit) abandon(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probing = false
	c.signal()
}

func (c *consumerCircuit) signal() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *consumerCircuit) setState(st CircuitState) {
	if c.metrics != nil {
		c.metrics.CircuitChanged(st)
	}
}
