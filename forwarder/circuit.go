package forwarder

import (
	"sync"
	"time"
)

// circuitState is exported as the forwarder_circuit_state gauge.
type circuitState int

const (
	circuitClosed   circuitState = 0 // publishing normally
	circuitOpen     circuitState = 1 // broker unreachable: passes do nothing until the probe time
	circuitHalfOpen circuitState = 2 // probe time reached: the next pass publishes one row
)

func (s circuitState) String() string {
	switch s {
	case circuitOpen:
		return "open"
	case circuitHalfOpen:
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
	failures  int // consecutive transport failures
	openUntil time.Time
}

func (c *circuit) state(now time.Time) (circuitState, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.failures == 0:
		return circuitClosed, time.Time{}
	case now.Before(c.openUntil):
		return circuitOpen, c.openUntil
	default:
		return circuitHalfOpen, c.openUntil
	}
}

// recordTransportFailure opens the circuit until the next probe time.
func (c *circuit) recordTransportFailure(now time.Time) time.Time {
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
