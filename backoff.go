package outboxkit

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff: attempt n waits Initial·Multiplierⁿ⁻¹, capped at Max, then
// moved by a random factor within ±Jitter.
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64 // 0 ≤ Jitter < 1
}

// Delay returns the wait after attempt failures (attempt ≥ 1).
//
// It is a pure function of the attempt number rather than a stateful backoff object (as in
// cenkalti/backoff) because the attempt count often lives elsewhere: in an outbox row, which any
// relay after any restart must schedule the same way, or in a delivery counter.
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

// Validate reports what is wrong with b, naming it as field. A zero Max or Multiplier is an
// error, never a silent constant delay.
func (b Backoff) Validate(field string) error {
	var errs []error
	if b.Initial <= 0 {
		errs = append(errs, fmt.Errorf("%s.Initial must be positive, got %s", field, b.Initial))
	}
	if b.Max < b.Initial {
		errs = append(errs, fmt.Errorf("%s.Max (%s) must be at least Initial (%s)", field, b.Max, b.Initial))
	}
	if b.Multiplier < 1 {
		errs = append(errs, fmt.Errorf("%s.Multiplier must be at least 1, got %g (1 keeps the delay constant)", field, b.Multiplier))
	}
	if b.Jitter < 0 || b.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("%s.Jitter must be in [0, 1), got %g", field, b.Jitter))
	}
	return errors.Join(errs...)
}
