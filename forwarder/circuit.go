package forwarder

import (
	"context"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit"
)

// CircuitState is the state of the relay's broker circuit; its value is what the
// outboxkit_forwarder_circuit_state gauge exports.
type CircuitState int

const (
	CircuitClosed   CircuitState = 0 // publishing normally
	CircuitOpen     CircuitState = 1 // broker unreachable: passes publish nothing until the broker answers again
	CircuitHalfOpen CircuitState = 2 // the broker answered, or the probe time came: the next pass publishes one row
)

func (s CircuitState) String() string {
	switch s {
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half-open"
	}
	return "closed"
}

// circuit tracks whether the broker can be reached. It is hand-rolled rather than taken from
// sony/gobreaker because it must read the injected clock (so tests move time without sleeping),
// and because while it is open it watches the broker instead of waiting out a fixed timeout.
//
// While open, a publisher that can Check (every backend's) is asked every CircuitWatch whether
// the broker answers — a dial, a PING, a metadata request — and the circuit half-opens as soon as
// it does, so that publishing resumes within about CircuitWatch of the broker's return however long
// it was away. A publisher that cannot is probed with one message at CircuitBackoff instead.
type circuit struct {
	backoff Backoff
	watch   time.Duration

	mu        sync.Mutex
	failures  int       // consecutive failures to reach the broker
	openUntil time.Time // the probe time: a publisher without Check, or a refusal, waits for it
	nextCheck time.Time // when the watch asks the broker again
	refused   bool      // the last publish or check was a refusal of the relay's credentials
}

func (c *circuit) state(now time.Time) (CircuitState, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.failures == 0:
		return CircuitClosed, time.Time{}
	case now.Before(c.openUntil):
		return CircuitOpen, c.openUntil
	default:
		return CircuitHalfOpen, c.openUntil
	}
}

// isOpen reports whether the circuit is open or half-open.
func (c *circuit) isOpen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures > 0
}

// recordUnreachable opens the circuit until the probe time, and schedules the watch's next check
// one CircuitWatch later. A refusal of the relay's credentials is not watched (no outage ends it,
// and a broker is not asked four times a second to refuse them again): it waits for the probe time.
func (c *circuit) recordUnreachable(now time.Time, refused bool) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	c.openUntil = now.Add(c.backoff.Delay(c.failures))
	c.refused = refused
	c.nextCheck = now.Add(c.watch)
	return c.openUntil
}

// recordReachable closes the circuit: the broker answered, whatever it said about the message.
func (c *circuit) recordReachable() (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen = c.failures > 0
	c.failures = 0
	c.refused = false
	return wasOpen
}

// dueCheck reports whether the watch should ask the broker now, and if so books the next check.
func (c *circuit) dueCheck(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failures == 0 || c.refused || now.Before(c.nextCheck) {
		return false
	}
	c.nextCheck = now.Add(c.watch)
	return true
}

// checked records the answer to a check: the broker answered (the circuit half-opens, so the next
// pass publishes), refused the relay's credentials (the probe time decides), or did not answer.
func (c *circuit) checked(now time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.failures == 0:
	case err == nil:
		c.openUntil = now
	case outboxkit.IsAccessDenied(err):
		c.refused = true
	}
}

// nextWake is when the relay should look at the circuit again: the next check while it watches
// the broker, the probe time otherwise.
func (c *circuit) nextWake(watching bool) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if watching && !c.refused && c.nextCheck.Before(c.openUntil) {
		return c.nextCheck
	}
	return c.openUntil
}

// watchBroker asks a publisher that can Check whether the broker answers, when the watch is due.
// It reports whether the broker answered, in which case the circuit is half-open.
func (f *Forwarder) watchBroker(ctx context.Context, now time.Time) bool {
	c, ok := f.cfg.Publisher.(checker)
	if !ok || !f.circuit.dueCheck(now) {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	err := c.Check(cctx)
	cancel()
	f.circuit.checked(f.cfg.Now(), err)
	return err == nil
}
