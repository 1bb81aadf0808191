package forwarder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Stats describes the outbox's backlog.
type Stats struct {
	Pending            int           // rows waiting to be published (including rows backing off)
	OldestPendingAge   time.Duration // age of the oldest pending row; 0 when none
	DeadLettered       int           // rows parked after MaxAttempts, waiting for an operator
	OldestDeadLettered time.Duration // time since the oldest dead letter was parked; 0 when none
}

// Stats reads the backlog in one query over the index of unpublished rows.
func (f *Forwarder) Stats(ctx context.Context) (Stats, error) {
	var (
		s                      Stats
		oldestPending, oldDead pgtype.Timestamptz
	)
	err := f.cfg.Pool.QueryRow(ctx, f.q.stats).Scan(&s.Pending, &oldestPending, &s.DeadLettered, &oldDead)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	now := f.cfg.Now()
	if oldestPending.Valid {
		s.OldestPendingAge = max(0, now.Sub(oldestPending.Time))
	}
	if oldDead.Valid {
		s.OldestDeadLettered = max(0, now.Sub(oldDead.Time))
	}
	return s, nil
}

// DeadLetterFilter selects dead-lettered rows. Set fields narrow the selection (they combine with
// AND); an empty filter selects nothing unless All is set, so that a forgotten flag never replays
// everything.
type DeadLetterFilter struct {
	Seqs         []int64
	UUIDs        []string
	Topic        string
	PartitionKey string
	All          bool
}

func (d DeadLetterFilter) empty() bool {
	return len(d.Seqs) == 0 && len(d.UUIDs) == 0 && d.Topic == "" && d.PartitionKey == ""
}

// ReplayDeadLetters puts the selected dead-lettered rows back in line with a fresh attempt budget
// and returns their seqs. They keep their UUIDs, so a consumer that already processed one (before
// a lost mark, say) absorbs the replay in its inbox. Replayed rows keep their place in their key's
// order.
func (f *Forwarder) ReplayDeadLetters(ctx context.Context, filter DeadLetterFilter) ([]int64, error) {
	if filter.empty() && !filter.All {
		return nil, errors.New("replay dead letters: the filter is empty; name seqs, UUIDs, a topic or a key, or set All")
	}
	if filter.Seqs == nil {
		filter.Seqs = []int64{}
	}
	if filter.UUIDs == nil {
		filter.UUIDs = []string{}
	}
	rows, err := f.cfg.Pool.Query(ctx, f.q.replay, filter.Seqs, filter.UUIDs, filter.Topic, filter.PartitionKey)
	if err != nil {
		return nil, fmt.Errorf("replay dead letters: %w", err)
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("replay dead letters: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replay dead letters: %w", err)
	}
	f.cfg.Logger.Info("Replayed dead-lettered outbox rows", map[string]any{"forwarder": f.cfg.Name, "rows": len(seqs)})
	return seqs, nil
}

// PrunePublished deletes rows published more than Retention.Age ago, Retention.BatchSize rows per
// statement (each its own short transaction), until none is left. It returns the number deleted.
// Run calls it every Retention.Interval unless Retention.Keep is set.
func (f *Forwarder) PrunePublished(ctx context.Context) (int, error) {
	cutoff := f.cfg.Now().Add(-f.cfg.Retention.Age)
	total := 0
	for {
		tag, err := f.cfg.Pool.Exec(ctx, f.q.prunePublished, cutoff, f.cfg.Retention.BatchSize)
		if err != nil {
			return total, fmt.Errorf("prune published outbox rows: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < f.cfg.Retention.BatchSize {
			return total, nil
		}
	}
}
