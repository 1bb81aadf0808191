package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
)

func outboxStats[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a", "b"}, 2)
	clk := newClock()
	clk.Advance(90 * time.Second)
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "a" {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	s, err := f.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending != 4 || s.OldestPendingAge < 85*time.Second || s.OldestPendingAge > 5*time.Minute || s.DeadLettered != 0 {
		t.Fatalf("stats before = %+v", s)
	}
	dispatch(t, f) // a's head dead-lettered, b published
	clk.Advance(time.Minute)
	s, _ = f.Stats(context.Background())
	if s.Pending != 1 || s.DeadLettered != 1 || s.OldestDeadLettered.Round(time.Millisecond) != time.Minute {
		t.Fatalf("stats after = %+v; want 1 pending (a's second row), 1 dead letter a minute old", s)
	}
}
