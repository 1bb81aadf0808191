package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// DefaultSoloWait is the default of DeadLetterConfig.SoloWait.
const DefaultSoloWait = time.Minute

// DefaultMaxSoloWaits is the default of DeadLetterConfig.MaxSoloWaits.
const DefaultMaxSoloWaits = 3

// gate lets the deliveries of a process run together, or one suspect of crashing the process run
// alone: a delivery holds it shared while its handler runs (a batch consumer's batch too), a
// suspect exclusively. It is process-wide, as a crash is: every consumer of the process loses what
// it had in flight. Waiters are served in arrival order, so a suspect waiting for the gate holds
// back the deliveries that arrive after it and gets it once those in progress end.
//
// A delivery run inside another's handler — an outboxkit stack called with a context derived from
// the message being handled — runs under the hold around it rather than queueing again: behind a
// suspect that waits for the outer delivery to end, it would wait for that suspect, and both
// would stall until SoloWait ran out.
var gate = semaphore.NewWeighted(math.MaxInt64)

// gateHold is one hold of the gate, shared by the deliveries that run under it: the delivery that
// took it and those its handler runs. The gate is given back when the last of them ends.
type gateHold struct {
	mu     sync.Mutex
	users  int
	weight int64
	alone  bool
	parent *gateHold // the shared hold a suspect run inside another delivery's handler stands on
}

type gateKey struct{}

// bind returns ctx carrying h, for the handler that runs under it.
func (h *gateHold) bind(ctx context.Context) context.Context {
	if held, _ := ctx.Value(gateKey{}).(*gateHold); held == h {
		return ctx
	}
	return context.WithValue(ctx, gateKey{}, h)
}

// join makes one more user of h, unless it was given back already.
func (h *gateHold) join() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.users == 0 {
		return false
	}
	h.users++
	return true
}

// release ends one user of h; the last gives the gate back.
func (h *gateHold) release() {
	h.mu.Lock()
	h.users--
	last := h.users == 0
	h.mu.Unlock()
	if last {
		gate.Release(h.weight)
		if h.parent != nil {
			h.parent.release()
		}
	}
}

// holdShared takes the gate for one delivery (or batch), or joins the hold in ctx: the delivery
// runs inside another's handler, which holds the gate already.
func holdShared(ctx context.Context) (*gateHold, error) {
	if h, ok := ctx.Value(gateKey{}).(*gateHold); ok && h.join() {
		return h, nil
	}
	if err := gate.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	return &gateHold{users: 1, weight: 1}, nil
}

// holdAlone takes the gate for a suspect: no other delivery of the process runs until release.
// Inside the handler of a suspect running alone, it joins that hold. Inside another delivery's
// handler, it waits for every other delivery to end but the one it runs inside, whose share it
// keeps: the suspect then runs alone but for the deliveries it is part of, which would die with it
// anyway.
func holdAlone(ctx context.Context) (*gateHold, error) {
	outer, ok := ctx.Value(gateKey{}).(*gateHold)
	if !ok || !outer.join() {
		if err := gate.Acquire(ctx, math.MaxInt64); err != nil {
			return nil, err
		}
		return &gateHold{users: 1, weight: math.MaxInt64, alone: true}, nil
	}
	if outer.alone {
		return outer, nil
	}
	// The outer delivery's share, which join keeps, and the rest of the gate: no other share.
	if err := gate.Acquire(ctx, math.MaxInt64-outer.weight); err != nil {
		outer.release()
		return nil, err
	}
	return &gateHold{users: 1, weight: math.MaxInt64 - outer.weight, alone: true, parent: outer}, nil
}

// soloKey is the delivery-count key under which a suspect's attempt alone is recorded: a row of
// inbox_deliveries of its own, written only for suspects, and removed once the attempt finishes.
func soloKey(messageID string) string { return keyOf("solo:", messageID) }

// soloWaitKey is the delivery-count key under which a suspect's deliveries that waited SoloWait in
// vain are counted, since its last attempt alone: a row of inbox_deliveries of its own, written
// only for suspects that could not run alone, and removed once the suspect gets its attempt alone
// or is dead-lettered.
func soloWaitKey(messageID string) string { return keyOf("solowait:", messageID) }

// keyOf prefixes a message id, or a digest of one too long for the delivery count's key.
func keyOf(prefix, messageID string) string {
	if len(messageID) <= 200 {
		return prefix + messageID
	}
	sum := sha256.Sum256([]byte(messageID))
	return prefix + "sha256:" + hex.EncodeToString(sum[:])
}
