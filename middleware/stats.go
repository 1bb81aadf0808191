package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/schema"
)

// ConsumerStats is what the inbox tables say about one consumer.
type ConsumerStats struct {
	Consumer    string `json:"consumer"`
	Processed   int64  `json:"processed"`    // messages processed, within the inbox retention
	Duplicates  int64  `json:"duplicates"`   // deliveries absorbed by the inbox after the first
	DeadLetters int64  `json:"dead_letters"` // quarantined messages waiting for a replay
}

// Stats reads per-consumer figures from the inbox and dead-letter tables, by consumer name.
func Stats(ctx context.Context, pool *pgxpool.Pool, schemaName string) ([]ConsumerStats, error) {
	name, err := schema.Parse(schemaName)
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("consumer stats: pool is nil")
	}
	rows, err := pool.Query(ctx, name.Render(querySQL("consumer_stats.sql")))
	if err != nil {
		return nil, fmt.Errorf("consumer stats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerStats, error) {
		var s ConsumerStats
		err := r.Scan(&s.Consumer, &s.Processed, &s.Duplicates, &s.DeadLetters)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("consumer stats: %w", err)
	}
	return out, nil
}
