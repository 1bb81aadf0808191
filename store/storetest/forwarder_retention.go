package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
)

func prunePublished[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 30)
	clk := newClock()
	f := newForwarder(t, e.Store, newFakePublisher(), clk, func(c *forwarder.Config) {
		c.BatchSize = 20 // 20 published now, 10 left pending
		c.Retention.Age = 24 * time.Hour
		c.Retention.BatchSize = 7 // several bounded statements
	})
	dispatch(t, f)
	clk.Advance(23 * time.Hour)
	if n, err := f.PrunePublished(context.Background()); err != nil || n != 0 {
		t.Fatalf("prune before the retention age deleted %d (%v)", n, err)
	}
	clk.Advance(2 * time.Hour)
	n, err := f.PrunePublished(context.Background())
	if err != nil || n != 20 {
		t.Fatalf("prune after the retention age deleted %d (%v), want 20", n, err)
	}
	if left := e.MustInt(t, pending); left != 10 {
		t.Fatalf("%d pending rows left, want 10 untouched", left)
	}
}

func deleteOnPublish[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 5)
	f := newForwarder(t, e.Store, newFakePublisher(), newClock(), func(c *forwarder.Config) { c.Retention.DeleteOnPublish = true })
	if res := dispatch(t, f); res.Published != 5 {
		t.Fatalf("result = %+v", res)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("%d rows left; DeleteOnPublish keeps nothing", n)
	}
}
