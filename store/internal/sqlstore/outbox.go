package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	c, err := s.d.Claim(ctx, s.db, p)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", s.d.Classify(err))
	}
	return c, nil
}

func (s *Store) Waker() store.Waker {
	w := s.d.Waker()
	if a, ok := s.d.(awakeDialect); ok && w != nil {
		return awakeWaker{Waker: w, awake: func(ctx context.Context, d time.Duration) error {
			return s.d.Classify(a.Awake(ctx, s.db, d))
		}}
	}
	return w
}

// awakeDialect is a dialect whose writers skip the wake-up while a relay says it is awake.
type awakeDialect interface {
	Awake(ctx context.Context, q dbexec.Querier, d time.Duration) error
}

type awakeWaker struct {
	store.Waker
	awake func(context.Context, time.Duration) error
}

func (w awakeWaker) Awake(ctx context.Context, d time.Duration) error { return w.awake(ctx, d) }

func (s *Store) OutboxStats(ctx context.Context, now time.Time) (store.OutboxStats, error) {
	var (
		st                     store.OutboxStats
		oldestPending, oldDead dbexec.Time
	)
	if err := s.db.QueryRow(ctx, s.q.OutboxStats).Scan(&st.Pending, &oldestPending, &st.DeadLettered, &oldDead); err != nil {
		return store.OutboxStats{}, fmt.Errorf("read outbox stats: %w", s.d.Classify(err))
	}
	if !oldestPending.IsZero() {
		st.OldestPendingAge = max(0, now.Sub(oldestPending.Time))
	}
	if !oldDead.IsZero() {
		st.OldestDeadLettered = max(0, now.Sub(oldDead.Time))
	}
	return st, nil
}

func (s *Store) PrunePublished(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	n, err := s.db.Exec(ctx, s.q.PrunePublished, s.d.Time(cutoff), limit)
	if err != nil {
		return 0, fmt.Errorf("prune published outbox rows: %w", s.d.Classify(err))
	}
	return int(n), nil
}

// MarkCommitted implements store.Committer.
func (s *Store) MarkCommitted(ctx context.Context, seqs []int64, now time.Time, deleteRows bool) (int, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	var (
		n   int64
		err error
	)
	if deleteRows {
		n, err = s.db.Exec(ctx, s.q.DeleteCommitted, s.d.Int64s(seqs))
	} else {
		n, err = s.db.Exec(ctx, s.q.MarkCommitted, s.d.Time(now), s.d.Int64s(seqs))
	}
	if err != nil {
		return 0, fmt.Errorf("mark outbox rows a broker transaction committed: %w", s.d.Classify(err))
	}
	return int(n), nil
}
