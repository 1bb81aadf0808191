package forwarder

import (
	"math/rand/v2"
	"time"

	"github.com/outboxkit/outboxkit"
)

// Backoff is outboxkit.Backoff: attempt n waits Initial·Multiplierⁿ⁻¹, capped at Max, ±Jitter.
type Backoff = outboxkit.Backoff

// jittered moves d by a random factor within ±fraction.
func jittered(d time.Duration, fraction float64) time.Duration {
	return time.Duration(float64(d) * (1 + fraction*(2*rand.Float64()-1)))
}
