package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/middleware"
)

// snapshot is one status line: what every hop has done so far.
type snapshot struct {
	Orders            int
	Pending           int
	Published         int
	OutboxDeadLetters int // outbox
	Processed         map[string]int64
	Duplicates        int64
	InboxDeadLetters  int64 // consumers' dead letters
	OldestAgeSec      float64
	// Backlog is what the broker holds for each consumer (waiting and unacknowledged), where the
	// broker can tell.
	Backlog map[string]int64
}

func takeSnapshot(ctx context.Context, b *business) (snapshot, error) {
	s := snapshot{Processed: map[string]int64{}, Backlog: map[string]int64{}}
	if err := b.db.SQL.QueryRowContext(ctx, b.q(`SELECT (SELECT count(*) FROM {{t}}.orders),
		(SELECT count(*) FROM {{t}}.outbox WHERE published_at IS NOT NULL)`)).Scan(&s.Orders, &s.Published); err != nil {
		return s, err
	}
	st, err := b.db.OutboxStats(ctx, time.Now())
	if err != nil {
		return s, err
	}
	s.Pending, s.OutboxDeadLetters, s.OldestAgeSec = st.Pending, st.DeadLettered, st.OldestPendingAge.Seconds()
	consumers, err := middleware.Stats(ctx, b.db)
	if err != nil {
		return s, err
	}
	for _, c := range consumers {
		s.Processed[c.Consumer] = c.Processed
		s.Duplicates += c.Duplicates
		s.InboxDeadLetters += c.DeadLetters
	}
	if b.lag != nil {
		for _, c := range consumerNames {
			if l, err := b.lag(ctx, c.name); err == nil {
				s.Backlog[c.name] = l.Waiting + l.Unacked
			}
		}
	}
	return s, nil
}

func (s snapshot) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "orders %d | outbox pending %d, published %d, dead %d | processed", s.Orders, s.Pending, s.Published, s.OutboxDeadLetters)
	for _, c := range consumerNames {
		fmt.Fprintf(&b, " %s %d", c.name, s.Processed[c.name])
		if n, ok := s.Backlog[c.name]; ok {
			fmt.Fprintf(&b, " (%d in the broker)", n)
		}
	}
	fmt.Fprintf(&b, " | duplicates absorbed %d | dead letters %d", s.Duplicates, s.InboxDeadLetters)
	return b.String()
}
