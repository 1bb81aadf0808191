package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit/pipeline"
)

// newSchema migrates outboxkit's tables into a fresh schema named prefix_<unique> and returns
// it with the function that drops it again.
func newSchema(ctx context.Context, pool *pgxpool.Pool, prefix string) (schema string, drop func(), err error) {
	schema = fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e9)
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer db.Close()
	if _, err := pipeline.Migrate(ctx, db, schema); err != nil {
		return "", nil, err
	}
	return schema, func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }, nil
}

// started waits for a component's Running channel, for at most 30s.
func started(running <-chan struct{}, what string) error {
	select {
	case <-running:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not start within 30s", what)
	}
}
