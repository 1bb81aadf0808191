package middleware

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// queued reports whether a delivery waits for the gate: a share cannot be taken at once.
func queued() bool {
	if gate.TryAcquire(1) {
		gate.Release(1)
		return false
	}
	return true
}

// untilQueued waits until something waits for the gate.
func untilQueued(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !queued() {
		if time.Now().After(deadline) {
			t.Fatal("nothing queued for the gate within 10s")
		}
		runtime.Gosched()
	}
}

// take returns a release of h that the test's end calls too, if the test did not: a hold left
// behind would stall the tests after it.
func take(t *testing.T, h *gateHold, err error) (release func()) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(h.release) }
	t.Cleanup(release)
	return release
}

// A delivery run inside another's handler joins the hold around it. Were it to queue, a suspect
// that arrived in between would make it wait for the suspect, and the suspect for the outer
// delivery: both stalled until the suspect's SoloWait ran out, and the whole process behind them.
func TestGateNestedDeliveryJoinsTheHoldAroundIt(t *testing.T) {
	ctx := context.Background()
	outer, err := holdShared(ctx)
	releaseOuter := take(t, outer, err)
	suspect := make(chan error, 1)
	go func() {
		wait, cancel := context.WithTimeout(ctx, 2*time.Second) // a short SoloWait
		defer cancel()
		h, err := holdAlone(wait)
		if err == nil {
			h.release()
		}
		suspect <- err
	}()
	untilQueued(t)

	nested := make(chan error, 1)
	go func() {
		h, err := holdShared(outer.bind(ctx))
		if err == nil {
			h.release()
		}
		nested <- err
	}()
	select {
	case err := <-nested:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the nested delivery is still waiting for the gate")
	}
	select {
	case err := <-suspect:
		t.Fatalf("the suspect stopped waiting (%v) before the nested delivery ran: the nested delivery waited for it until its SoloWait ran out", err)
	default:
	}
	releaseOuter()
	if err := <-suspect; err != nil {
		t.Fatalf("the suspect did not get the gate once the outer delivery ended: %v", err)
	}
}

// A suspect run inside another delivery's handler waits for every other delivery to end, not for
// the one it runs inside — that one never ends before it, and waiting for it would only run out
// SoloWait, the process stalled behind it. Inside a suspect running alone, a delivery runs at once.
func TestGateNestedSuspectRunsAloneButForTheDeliveryAroundIt(t *testing.T) {
	ctx := context.Background()
	outer, err := holdShared(ctx)
	releaseOuter := take(t, outer, err)
	other, err := holdShared(ctx) // another delivery of the process
	releaseOther := take(t, other, err)
	got := make(chan *gateHold, 1)
	failed := make(chan error, 1)
	go func() {
		wait, cancel := context.WithTimeout(outer.bind(ctx), 5*time.Second)
		defer cancel()
		h, err := holdAlone(wait)
		if err != nil {
			failed <- err
			return
		}
		got <- h
	}()
	untilQueued(t) // it waits for the other delivery
	releaseOther()
	var alone *gateHold
	select {
	case alone = <-got:
	case err := <-failed:
		t.Fatalf("the nested suspect did not get the gate once the other delivery ended: %v", err)
	}
	releaseAlone := take(t, alone, nil)
	if !queued() {
		t.Fatal("a delivery could start beside the nested suspect")
	}
	within, cancel := context.WithTimeout(alone.bind(ctx), 5*time.Second)
	defer cancel()
	inner, err := holdShared(within) // a delivery its handler runs
	take(t, inner, err)()
	innerAlone, err := holdAlone(within) // a suspect its handler runs
	take(t, innerAlone, err)()
	releaseAlone()
	if queued() {
		t.Fatal("the gate is still held alone after the nested suspect ended")
	}
	releaseOuter()
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, err := holdAlone(wait)
	if err != nil {
		t.Fatalf("the gate is not free after every hold ended: %v", err)
	}
	h.release()
}

// A context carrying a hold given back already takes the gate anew.
func TestGateReleasedHoldInContextIsNotJoined(t *testing.T) {
	ctx := context.Background()
	h, err := holdShared(ctx)
	take(t, h, err)()
	stale := h.bind(ctx)
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	alone, err := holdAlone(wait)
	take(t, alone, err)
	wait, cancel = context.WithTimeout(stale, 50*time.Millisecond)
	defer cancel()
	if _, err := holdShared(wait); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a delivery with a given-back hold in its context ran beside a suspect (%v)", err)
	}
}

// The gate's cost on every delivery: a share taken and given back, with its context.
func BenchmarkGateShared(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h, err := holdShared(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = h.bind(ctx)
		h.release()
	}
}

// The same from GOMAXPROCS goroutines at once.
func BenchmarkGateSharedParallel(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, err := holdShared(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			_ = h.bind(ctx)
			h.release()
		}
	})
}
