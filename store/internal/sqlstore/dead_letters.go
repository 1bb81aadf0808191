package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) outboxFilterArgs(f store.DeadLetterFilter) []any {
	return []any{s.d.Int64s(f.IDs), s.d.Strings(f.MessageIDs), f.Topic, f.PartitionKey, f.ReasonContains,
		s.d.NullTime(f.From), s.d.NullTime(f.Until)}
}

// limit is a listing's bound: 100 by default, none (as large as the databases take) when negative.
func limit(n int) int {
	switch {
	case n == 0:
		return 100
	case n < 0:
		return math.MaxInt32
	}
	return n
}

func (s *Store) OutboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	f.Limit = limit(f.Limit)
	letters, err := s.outboxDeadLetters(ctx, s.db, s.q.OutboxDeadLetters, append(s.outboxFilterArgs(f), f.Limit))
	if err != nil {
		return nil, fmt.Errorf("list outbox dead letters: %w", err)
	}
	return letters, nil
}

func (s *Store) outboxDeadLetters(ctx context.Context, q dbexec.Querier, query string, args []any) ([]store.DeadLetter, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, s.d.Classify(err)
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var (
			created, deadAt dbexec.Time
			metadata        []byte
			key             *string // NULL: no partition key
			letter          store.DeadLetter
		)
		if err := rows.Scan(&letter.ID, &letter.MessageID, &letter.Topic, &key, &letter.Payload, &metadata,
			&letter.Attempts, &letter.Reason, &created, &deadAt); err != nil {
			return nil, s.d.Classify(err)
		}
		if key != nil {
			letter.PartitionKey = *key
		}
		letter.CreatedAt, letter.DeadLetteredAt = created.Time, deadAt.Time
		letter.Metadata = decodeMetadata(metadata)
		out = append(out, letter)
	}
	return out, s.d.Classify(rows.Err())
}

func decodeMetadata(raw []byte) map[string]string {
	var md map[string]string
	if json.Unmarshal(raw, &md) != nil {
		return nil // not an object of strings: the reason it was dead-lettered, likely
	}
	return md
}

func (s *Store) ReplayOutboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	if f.Empty() && !f.All {
		return nil, fmt.Errorf("replay outbox dead letters: %w", store.ErrEmptyFilter)
	}
	var letters []store.DeadLetter
	err := s.inTx(ctx, func(tx dbexec.Tx) error {
		var err error
		letters, err = s.outboxDeadLetters(ctx, tx, s.q.LockOutboxDeadLetters, s.outboxFilterArgs(f))
		if err != nil || len(letters) == 0 {
			return err
		}
		seqs := make([]int64, len(letters))
		for i, l := range letters {
			seqs[i] = l.ID
		}
		_, err = tx.Exec(ctx, s.q.ReplayOutbox, s.d.Int64s(seqs))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("replay outbox dead letters: %w", err)
	}
	return letters, nil
}

func (s *Store) DeadLettersWaiting(ctx context.Context, consumer string, now time.Time) (store.WaitingLetters, error) {
	var (
		w      store.WaitingLetters
		oldest dbexec.Time
	)
	if err := s.db.QueryRow(ctx, s.q.DeadLettersWaiting, consumer).Scan(&w.Count, &oldest); err != nil {
		return store.WaitingLetters{}, fmt.Errorf("dead letters waiting for %s: %w", consumer, s.d.Classify(err))
	}
	if !oldest.IsZero() {
		w.OldestAge = max(0, now.Sub(oldest.Time))
	}
	return w, nil
}

func (s *Store) InboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	f.Limit = limit(f.Limit)
	rows, err := s.db.Query(ctx, s.q.InboxDeadLetters, s.d.Int64s(f.IDs), s.d.Strings(f.MessageIDs), f.Consumer, f.Topic,
		f.ReasonContains, s.d.NullTime(f.From), s.d.NullTime(f.Until), f.IncludeReplayed, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var (
			letter           store.DeadLetter
			metadata         []byte
			deadAt, replayed dbexec.Time
		)
		if err := rows.Scan(&letter.ID, &letter.Consumer, &letter.Topic, &letter.MessageID, &letter.Payload, &metadata,
			&letter.Reason, &letter.Attempts, &deadAt, &replayed); err != nil {
			return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
		}
		letter.DeadLetteredAt, letter.ReplayedAt = deadAt.Time, replayed.Time
		letter.Metadata = decodeMetadata(metadata)
		out = append(out, letter)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
	}
	return out, nil
}

func (s *Store) MarkReplayed(ctx context.Context, id int64, now time.Time) error {
	_, err := s.db.Exec(ctx, s.q.MarkReplayed, id, s.d.Time(now))
	return s.d.Classify(err)
}

// insertDeadLetter stores a consumer's dead letter through q (the pool, a held connection or an
// inbox transaction), filed under the facts read from it.
func (s *Store) insertDeadLetter(ctx context.Context, q dbexec.Querier, l store.InboxDeadLetter) error {
	payload := l.Payload
	if payload == nil {
		payload = []byte{}
	}
	f := FactsOf(l.Metadata, l.Reason)
	_, err := q.Exec(ctx, s.q.DeadLetter, l.Consumer, l.Topic, l.MessageID, payload, string(l.Metadata), l.Reason,
		l.Deliveries, s.d.Time(l.Now), f.PartitionKey, f.EventType, f.FailureGroup, f.SourceSeq)
	return err
}
