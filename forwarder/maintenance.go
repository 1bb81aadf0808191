package forwarder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/store"
)

// Stats reads the outbox's backlog.
func (f *Forwarder) Stats(ctx context.Context) (store.OutboxStats, error) {
	return f.cfg.Store.OutboxStats(ctx, f.cfg.Now())
}

// ReplayOutboxDeadLetters puts the dead-lettered rows matching filter back in line with a fresh attempt
// budget and returns them. They keep their UUIDs, so a consumer that already processed one (before
// a lost mark, say) absorbs the replay in its inbox; they keep their place in their key's order
// (for this relay: the log relay of package forwarder/pglog reads a replay as written when it
// commits, and publishes it then). An empty filter replays nothing unless All is set.
func (f *Forwarder) ReplayOutboxDeadLetters(ctx context.Context, filter store.DeadLetterFilter) ([]store.DeadLetter, error) {
	letters, err := f.cfg.Store.ReplayOutboxDeadLetters(ctx, filter)
	if err == nil {
		f.cfg.Logger.Info("Replayed dead-lettered outbox rows", watermill.LogFields{"forwarder": f.cfg.Name, "rows": len(letters)})
	}
	return letters, err
}

// PrunePublished deletes rows published more than Retention.Age ago, Retention.BatchSize rows per
// statement, and returns the number deleted. Run calls it every Retention.Interval unless
// Retention.Keep or Retention.DeleteOnPublish is set.
func (f *Forwarder) PrunePublished(ctx context.Context) (int, error) {
	return PrunePublished(ctx, f.cfg.Store, f.cfg.Now().Add(-f.cfg.Retention.Age), f.cfg.Retention.BatchSize)
}

// PrunePublished deletes rows of s published before cutoff, batchSize rows per statement (each
// its own short transaction), until none is left, and returns the number deleted.
func PrunePublished(ctx context.Context, s store.Store, cutoff time.Time, batchSize int) (int, error) {
	if s == nil {
		return 0, errors.New("prune published outbox rows: the store is nil")
	}
	if batchSize < 1 {
		return 0, fmt.Errorf("prune published outbox rows: batchSize must be positive, got %d", batchSize)
	}
	total := 0
	for {
		n, err := s.PrunePublished(ctx, cutoff, batchSize)
		total += n
		if err != nil {
			return total, err
		}
		if n < batchSize {
			return total, nil
		}
	}
}
