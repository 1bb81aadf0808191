package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/faults"
)

// Failure matrix, "crash after commit, before publish": the writer committed, and the relay that
// claimed the rows died before publishing any. The rows stay pending, the relay's hold on them
// dies with it, and the restarted relay publishes each exactly once.
func crashAfterCommitBeforePublish[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b"}, 3)
	pub := newFakePublisher()
	clk := newClock()
	dying := newForwarder(t, e.Store, pub, clk)
	crash := errors.New("relay died after claiming, before publishing")
	faults.Inject(dying, faults.BeforePublish, func() error { return crash })
	if _, err := dying.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := len(pub.timesSent()); n != 0 {
		t.Fatalf("%d messages published by the relay that died before publishing", n)
	}
	if n := e.MustInt(t, pending); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}
	res := dispatch(t, newForwarder(t, e.Store, pub, clk))
	if res.Claimed != 6 || res.Published != 6 {
		t.Fatalf("result = %+v, want 6 claimed and published", res)
	}
	for _, m := range msgs {
		if n := pub.timesSent()[m.UUID]; n != 1 {
			t.Errorf("message %s published %d times, want 1", m.UUID, n)
		}
	}
	if n := e.MustInt(t, pending); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

func crashAfterPublishBeforeMark[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b", "c"}, 2)
	clk := newClock()
	pub := newFakePublisher()
	f := newForwarder(t, e.Store, pub, clk)
	crash := errors.New("process died between publish and mark")
	faults.Inject(f, faults.AfterPublish, func() error { return crash })
	if _, err := f.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := e.MustInt(t, pending); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}
	clk.Advance(time.Hour) // past any lease the dead relay held
	restarted := newForwarder(t, e.Store, pub, clk)
	drain(t, restarted, clk)
	counts := pub.timesSent()
	for _, m := range msgs {
		if counts[m.UUID] != 2 {
			t.Errorf("message %s published %d times, want 2 (a duplicate, never a loss)", m.UUID, counts[m.UUID])
		}
	}
}
