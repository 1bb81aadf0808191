package pglog_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// The log sends a transaction once its commit record is flushed, a moment before other sessions
// see it committed: a flush whose DELETE misses a published row must remove it again before it
// confirms past it, or the row stays in the outbox for good.
func TestFlushRemovesRowsItsFirstSnapshotMissed(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := newRecorder()
	r := relayOn(t, pg, pub, nil)
	pglog.HideRowsFromFlushes(r, 1)
	run(t, r)
	ids := write(t, pg, "a", 3)
	testenv.Eventually(t, 10*time.Second, "events published", func() bool { return pub.has(ids) })
	testenv.Eventually(t, 10*time.Second, "published rows removed", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0
	})
}

// waitVisible waits while a transaction of the list is still running, and returns once it ends.
func TestWaitVisibleWaitsForRunningTransactions(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	r := relayOn(t, pg, newRecorder(), nil)
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	var xid int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pglog.WaitVisible(ctx, r, []uint32{uint32(xid)}) }()
	select {
	case err := <-done:
		t.Fatalf("returned while transaction %d runs: %v", xid, err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting 10 s after the transaction committed")
	}
	var committed int64
	if err := pg.Pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	if err := pglog.WaitVisible(ctx, r, []uint32{uint32(committed)}); err != nil {
		t.Fatalf("a committed transaction: %v", err)
	}
}
