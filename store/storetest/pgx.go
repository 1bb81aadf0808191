package storetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/store"
)

// PgxEnv is the Env of a store whose application transactions are pgx.Tx, on pool; rewrite turns
// the suite's statements into Postgres's (see Rewrite). HoldRow locks the row with SELECT … FOR
// UPDATE in a transaction of its own. The caller sets Another.
func PgxEnv(pool *pgxpool.Pool, s store.Driver[pgx.Tx], rewrite func(string) string) *Env[pgx.Tx] {
	return &Env[pgx.Tx]{
		Store:    s,
		Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		ExecTx: func(ctx context.Context, tx pgx.Tx, q string, args ...any) error {
			_, err := tx.Exec(ctx, rewrite(q), args...)
			return err
		},
		Exec: func(ctx context.Context, q string, args ...any) error {
			_, err := pool.Exec(ctx, rewrite(q), args...)
			return err
		},
		Int: func(ctx context.Context, q string, args ...any) (int, error) {
			var n int
			err := pool.QueryRow(ctx, rewrite(q), args...).Scan(&n)
			return n, err
		},
		HoldRow: func(t *testing.T, seq int64) func() {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, rewrite(`SELECT 1 FROM {{schema}}.outbox WHERE seq = ? FOR UPDATE`), seq); err != nil {
				t.Fatal(err)
			}
			return func() { _ = tx.Rollback(ctx) }
		},
	}
}
