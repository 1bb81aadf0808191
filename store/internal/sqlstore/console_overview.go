package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) TopicBacklog(ctx context.Context, headRows int) ([]store.TopicBacklog, bool, error) {
	// The oldest pending rows through the pending index, and no further: a backlog of millions
	// costs the same as one of headRows.
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT topic, count(*), min(created_at) FROM (
    SELECT topic, created_at FROM {{schema}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY seq LIMIT ?1
) AS head GROUP BY topic ORDER BY topic`), headRows)
	if err != nil {
		return nil, false, fmt.Errorf("read the outbox backlog: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var (
		out  []store.TopicBacklog
		read int64
	)
	for rows.Next() {
		var (
			t      store.TopicBacklog
			oldest dbexec.Time
		)
		if err := rows.Scan(&t.Topic, &t.Pending, &oldest); err != nil {
			return nil, false, fmt.Errorf("read the outbox backlog: %w", s.d.Classify(err))
		}
		t.OldestCreated = oldest.Time
		read += t.Pending
		out = append(out, t)
	}
	return out, read >= int64(headRows), s.d.Classify(rows.Err())
}

func (s *Store) ProcessedSince(ctx context.Context, since time.Time, capRows int) ([]store.ConsumerCount, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT consumer, count(*) FROM (
    SELECT consumer FROM {{schema}}.inbox WHERE processed_at >= ?1 LIMIT ?2
) AS recent GROUP BY consumer ORDER BY consumer`), s.d.Time(since), capRows)
	if err != nil {
		return nil, fmt.Errorf("count processed messages: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.ConsumerCount
	for rows.Next() {
		var c store.ConsumerCount
		if err := rows.Scan(&c.Consumer, &c.Count); err != nil {
			return nil, fmt.Errorf("count processed messages: %w", s.d.Classify(err))
		}
		out = append(out, c)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) ParkedCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT consumer, count(*) FROM {{schema}}.inbox_parked GROUP BY consumer`))
	if err != nil {
		return nil, fmt.Errorf("count parked messages: %w", s.d.Classify(err))
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			c string
			n int64
		)
		if err := rows.Scan(&c, &n); err != nil {
			return nil, fmt.Errorf("count parked messages: %w", s.d.Classify(err))
		}
		out[c] = n
	}
	return out, s.d.Classify(rows.Err())
}
