package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

func claimTopics(t *testing.T, s store.Store, relay string) []string {
	t.Helper()
	ctx := context.Background()
	cl, err := s.Claim(ctx, store.ClaimParams{Now: time.Now(), Limit: 100, Owner: relay + "-1", Relay: relay, Hold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Abandon(ctx)
	var out []string
	for _, r := range cl.Rows() {
		out = append(out, r.Topic+"/"+r.PartitionKey)
	}
	return out
}

func consolePause[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	writeTopics(t, e, [2]string{"a", "k1"}, [2]string{"b", "k1"}, [2]string{"b", "k2"})
	if created, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "a", By: "alice", At: time.Now()}); err != nil || !created {
		t.Fatalf("pause: %v, %v", created, err)
	}
	if created, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "a", By: "bob", At: time.Now()}); err != nil || created {
		t.Fatalf("pausing twice: created %v, %v; want the first pause kept", created, err)
	}
	// Topic a waits, and so does k1's later row on topic b: a key's order holds across topics.
	if got := claimTopics(t, e.Store, "r1"); !slices.Equal(got, []string{"b/k2"}) {
		t.Fatalf("claimed %v with topic a paused, want [b/k2]", got)
	}
	if ps, err := c.Pauses(ctx); err != nil || len(ps) != 1 || ps[0].By != "alice" {
		t.Fatalf("pauses: %+v, %v", ps, err)
	}
	if ok, err := c.ClearPause(ctx, store.PauseTopic, "a"); err != nil || !ok {
		t.Fatalf("resume: %v, %v", ok, err)
	}
	if _, err := c.SetPause(ctx, store.Pause{Scope: store.PauseRelay, Name: "r1", By: "alice", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := claimTopics(t, e.Store, "r1"); len(got) != 0 {
		t.Fatalf("paused relay r1 claimed %v", got)
	}
	if got := claimTopics(t, e.Store, "r2"); len(got) != 3 {
		t.Fatalf("relay r2 claimed %v, want all 3 rows", got)
	}
	if ok, err := c.ClearPause(ctx, store.PauseTopic, "a"); err != nil || ok {
		t.Fatalf("resuming what is not paused: %v, %v; want false", ok, err)
	}
}

// pausingPublisher pauses the topic at the first publish and holds it until the relay has read
// the pause: every later row of the same pass must then stay unpublished.
type pausingPublisher struct {
	*fakePublisher
	pause func()
	once  bool
}

func (p *pausingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.once {
		p.once = true
		p.pause()
	}
	return p.fakePublisher.Publish(topic, msgs...)
}

// A pause set in the middle of a pass stops the relay at the next row, once its heartbeat has read
// it; resumed, the rows go out in order.
func consolePauseWithinAPass[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	msgs := write(t, e, keysN(5), 2)
	inner := newFakePublisher()
	pub := &pausingPublisher{fakePublisher: inner}
	pub.pause = func() {
		if _, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "events", By: "alice", At: time.Now()}); err != nil {
			t.Error(err)
			return
		}
		at := time.Now() // after the commit: a heartbeat that read the pauses later saw it

		if !waitFor(10*time.Second, func() bool {
			relays, err := c.Relays(ctx)
			return err == nil && len(relays) == 1 && !relays[0].PausesSeen.Before(at)
		}) {
			t.Error("the relay's heartbeat did not read the pause within 10s")
		}
	}
	f := newForwarder(t, e.Store, pub, newClock(), func(cfg *forwarder.Config) {
		cfg.Now = time.Now
		cfg.MaxInFlight = 1
		cfg.HeartbeatInterval = 20 * time.Millisecond
		cfg.PollInterval = 50 * time.Millisecond
	})
	RunForwarder(t, f)
	if !waitFor(10*time.Second, func() bool { return !f.Health().LastPass.IsZero() }) {
		t.Fatal("no pass completed within 10s")
	}
	if n := len(inner.accepted()); n != 1 {
		t.Fatalf("%d rows published in the pass that was paused after its first row, want 1", n)
	}
	if _, err := c.ClearPause(ctx, store.PauseTopic, "events"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return len(inner.accepted()) == len(msgs) }) {
		t.Fatalf("resumed: %d of %d rows published within 10s", len(inner.accepted()), len(msgs))
	}
	assertPerKeyOrder(t, inner.accepted())
}
