package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// ConsumerStats is what the inbox tables say about one consumer.
type ConsumerStats = store.ConsumerStats

// Stats reads per-consumer figures from the inbox and dead-letter tables, by consumer name.
func Stats(ctx context.Context, s store.Store) ([]ConsumerStats, error) {
	if s == nil {
		return nil, errors.New("consumer stats: the store is nil")
	}
	return s.ConsumerStats(ctx, time.Now())
}
