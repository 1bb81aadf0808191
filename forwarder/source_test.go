package forwarder_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// sourceFunc is a Source of one function.
type sourceFunc func(ctx context.Context, r *forwarder.SourceRelay) error

func (f sourceFunc) Relay(ctx context.Context, r *forwarder.SourceRelay) error { return f(ctx, r) }

// heldControl is a store whose heartbeat calls wait for their context: it says when the first one
// starts, and how many are running.
type heldControl struct {
	*sqlitestore.Store
	entered chan struct{}
	calls   atomic.Int64
	running atomic.Int64
}

func (c *heldControl) Pauses(ctx context.Context) ([]store.Pause, error) {
	c.running.Add(1)
	defer c.running.Add(-1)
	if c.calls.Add(1) == 1 {
		close(c.entered)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (c *heldControl) RelayHeartbeat(context.Context, store.RelayBeat) error { return nil }

// The heartbeat runs while the source does and has stopped when RunSource returns: no goroutine
// it started is left, not even one in the middle of a heartbeat.
func TestRunSource_HeartbeatRunsBesideTheSourceAndStopsBeforeItReturns(t *testing.T) {
	st := &heldControl{Store: openOutbox(t, 0), entered: make(chan struct{})}
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: &flakyBroker{}, HeartbeatInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = relay.RunSource(ctx, sourceFunc(func(ctx context.Context, _ *forwarder.SourceRelay) error {
		select {
		case <-st.entered:
		case <-time.After(10 * time.Second):
			return errors.New("no heartbeat within 10s of the source's start")
		}
		cancel()
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if n := st.running.Load(); n != 0 {
		t.Errorf("RunSource returned with %d heartbeat calls still running", n)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left after RunSource returned: %v", err)
	}
}

// What stops the source is what RunSource returns.
func TestRunSource_ReturnsTheSourcesError(t *testing.T) {
	relay, err := forwarder.New(forwarder.Config{Store: openOutbox(t, 0), Publisher: &flakyBroker{}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := errors.New("the log is gone")
	err = relay.RunSource(context.Background(), sourceFunc(func(context.Context, *forwarder.SourceRelay) error { return stopped }))
	if !errors.Is(err, stopped) {
		t.Fatalf("RunSource returned %v, want the source's error", err)
	}
}

// One relay runs at a time on a Forwarder, of either kind; a nil source is refused.
func TestRunSource_RefusesASecondRunAndANilSource(t *testing.T) {
	relay, err := forwarder.New(forwarder.Config{Store: openOutbox(t, 0), Publisher: &flakyBroker{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := relay.RunSource(ctx, nil); err == nil {
		t.Error("RunSource accepted a nil source")
	}
	err = relay.RunSource(ctx, sourceFunc(func(ctx context.Context, _ *forwarder.SourceRelay) error {
		if err := relay.RunSource(ctx, sourceFunc(func(context.Context, *forwarder.SourceRelay) error { return nil })); err == nil {
			t.Error("a second RunSource ran beside the first")
		}
		runCtx, cancel := context.WithTimeout(ctx, 2*time.Second) // ends a Run that ran
		defer cancel()
		if err := relay.Run(runCtx); err == nil {
			t.Error("Run ran beside RunSource")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// waitPauses waits until the pauses the heartbeat read satisfy ok, on PausesChanged.
func waitPauses(ctx context.Context, src *forwarder.SourceRelay, what string, ok func() bool) error {
	deadline := time.After(10 * time.Second)
	for {
		changed := src.PausesChanged() // before the look: a change after it closes this one
		if ok() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errors.New("the heartbeat did not read " + what + " within 10s")
		}
	}
}

// PublishRows through a SourceRelay publishes no row of a paused topic, and nothing while the
// relay is paused, from the moment the heartbeat reads the pause until it reads the resume.
func TestRunSource_PublishRowsHonoursPauses(t *testing.T) {
	st := openOutbox(t, 0)
	broker := &flakyBroker{}
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker, Name: "log", HeartbeatInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pause := func(scope, name string) {
		t.Helper()
		if ok, err := st.SetPause(ctx, store.Pause{Scope: scope, Name: name, By: "test", At: time.Now()}); err != nil || !ok {
			t.Fatalf("pause %s %s: %v %v", scope, name, ok, err)
		}
	}
	resume := func(scope, name string) {
		t.Helper()
		if ok, err := st.ClearPause(ctx, scope, name); err != nil || !ok {
			t.Fatalf("resume %s %s: %v %v", scope, name, ok, err)
		}
	}
	row := func(seq int64, topic, key string) store.OutboxRow {
		return store.OutboxRow{Seq: seq, UUID: "0193a1f0-0000-7000-8000-00000000000" + string(rune('0'+seq)), Topic: topic, PartitionKey: key,
			Payload: []byte(`{}`), Metadata: []byte(`{}`)}
	}
	pause(store.PauseTopic, "orders")
	err = relay.RunSource(ctx, sourceFunc(func(ctx context.Context, src *forwarder.SourceRelay) error {
		if err := waitPauses(ctx, src, "the topic's pause", func() bool { return src.Paused("orders") }); err != nil {
			return err
		}
		if !src.Pausing() || src.RelayPaused() || src.Paused("billing") {
			t.Errorf("orders paused: pausing %v, relay paused %v, billing paused %v; want true, false, false",
				src.Pausing(), src.RelayPaused(), src.Paused("billing"))
		}
		d := src.PublishRows(ctx, []store.OutboxRow{row(1, "orders", "o-1"), row(2, "billing", "b-1")})
		if !slices.Equal(d.Published, []int64{2}) || d.Released != 1 || len(d.Failed) != 0 {
			t.Errorf("orders paused: published %v, released %d, failed %v; want [2], 1, none", d.Published, d.Released, d.Failed)
		}

		resume(store.PauseTopic, "orders")
		if err := waitPauses(ctx, src, "the resume", func() bool { return !src.Pausing() }); err != nil {
			return err
		}
		if d := src.PublishRows(ctx, []store.OutboxRow{row(1, "orders", "o-1")}); !slices.Equal(d.Published, []int64{1}) {
			t.Errorf("resumed: published %v, want [1]", d.Published)
		}

		pause(store.PauseRelay, "log")
		if err := waitPauses(ctx, src, "the relay's pause", src.RelayPaused); err != nil {
			return err
		}
		if d := src.PublishRows(ctx, []store.OutboxRow{row(3, "billing", "b-2"), row(4, "orders", "")}); len(d.Published) != 0 || d.Released != 2 {
			t.Errorf("relay paused: published %v, released %d; want none, 2", d.Published, d.Released)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := broker.received(); got != 2 {
		t.Errorf("the broker received %d messages, want 2 (billing's, then orders' once resumed)", got)
	}
}
