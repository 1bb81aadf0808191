package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"time"

	"golang.org/x/sync/semaphore"
)

// DefaultSoloWait is the default of DeadLetterConfig.SoloWait.
const DefaultSoloWait = time.Minute

// gate lets the deliveries of a process run together, or one suspect of crashing the process run
// alone: a delivery holds it shared while its handler runs (a batch consumer's batch too), a
// suspect exclusively. It is process-wide, as a crash is: every consumer of the process loses what
// it had in flight. Waiters are served in arrival order, so a suspect waiting for the gate holds
// back the deliveries that arrive after it and gets it once those in progress end.
var gate = semaphore.NewWeighted(math.MaxInt64)

// holdShared takes the gate for one delivery (or batch); release gives it back.
func holdShared(ctx context.Context) (release func(), err error) {
	if err := gate.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	return func() { gate.Release(1) }, nil
}

// holdAlone takes the gate for a suspect: no other delivery of the process runs until release.
func holdAlone(ctx context.Context) (release func(), err error) {
	if err := gate.Acquire(ctx, math.MaxInt64); err != nil {
		return nil, err
	}
	return func() { gate.Release(math.MaxInt64) }, nil
}

// soloKey is the delivery-count key under which a suspect's attempt alone is recorded: a row of
// inbox_deliveries of its own, written only for suspects, and removed once the attempt finishes.
func soloKey(messageID string) string {
	if len(messageID) <= 200 {
		return "solo:" + messageID
	}
	sum := sha256.Sum256([]byte(messageID))
	return "solo:sha256:" + hex.EncodeToString(sum[:])
}
