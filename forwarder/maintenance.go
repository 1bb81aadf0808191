package forwarder

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
)

// Stats reads the backlog; see Outbox.Stats.
func (f *Forwarder) Stats(ctx context.Context) (Stats, error) { return f.outbox.Stats(ctx) }

// ReplayDeadLetters puts dead-lettered rows back in line; see Outbox.ReplayDeadLetters.
func (f *Forwarder) ReplayDeadLetters(ctx context.Context, filter DeadLetterFilter) ([]int64, error) {
	seqs, err := f.outbox.ReplayDeadLetters(ctx, filter)
	if err == nil {
		f.cfg.Logger.Info("Replayed dead-lettered outbox rows", watermill.LogFields{"forwarder": f.cfg.Name, "rows": len(seqs)})
	}
	return seqs, err
}

// PrunePublished deletes rows published more than Retention.Age ago, Retention.BatchSize rows per
// statement, and returns the number deleted. Run calls it every Retention.Interval unless
// Retention.Keep or Retention.DeleteOnPublish is set.
func (f *Forwarder) PrunePublished(ctx context.Context) (int, error) {
	return f.outbox.PrunePublished(ctx, f.cfg.Retention.Age, f.cfg.Retention.BatchSize)
}
