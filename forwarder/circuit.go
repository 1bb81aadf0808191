package forwarder

import (
	"sync"
	"time"
)

// CircuitState is the state of the relay's broker circuit; its value is what the
// outboxkit_forwarder_circuit_state gauge exports.
type CircuitState int

const (
	CircuitClosed   CircuitState = 0 // publishing normally
	CircuitOpen     CircuitState = 1 // broker unreachable: passes do nothing until the probe time
	CircuitHalfOpen CircuitState = 2 // probe time reached: the next pass publishes one row
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
// sony/gobreaker because it must read the injected clock (so tests move time without sleeping)
// and back its probes off exponentially, which gobreaker's fixed open timeout does not.
type circuit struct {
	backoff Backoff

	mu        sync.Mutex
	failures  int // consecutive failures to reach the broker
	openUntil time.Time
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

// recordUnreachable opens the circuit until the next probe time.
func (c *circuit) recordUnreachable(now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	c.openUntil = now.Add(c.backoff.Delay(c.failures))
	return c.openUntil
}

// recordReachable closes the circuit: the broker answered, whatever it said about the message.
func (c *circuit) recordReachable() (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen = c.failures > 0
	c.failures = 0
	return wasOpen
}
