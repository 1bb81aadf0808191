package forwarder

import (
	"math"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before attempt number attempt+1, after attempt failures (attempt ≥ 1).
//
// It is a pure function of the attempt number rather than a stateful backoff object (as in
// cenkalti/backoff) because the state lives in the outbox row: any relay, after any restart, must
// compute the same schedule from the row's attempts column.
func (b Backoff) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(attempt-1))
	if d > float64(b.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(b.Max)
	}
	if b.Jitter > 0 {
		d *= 1 + b.Jitter*(2*rand.Float64()-1)
	}
	return time.Duration(d)
}

// jittered moves d by a random factor within ±fraction.
func jittered(d time.Duration, fraction float64) time.Duration {
	return time.Duration(float64(d) * (1 + fraction*(2*rand.Float64()-1)))
}
