package storetest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/outboxkit/outboxkit/store"
)

// StdEnv is the Env of a store whose application transactions are *sql.Tx, on db; rewrite turns
// the suite's statements into the dialect's (see Rewrite). HoldRow locks the row with SELECT …
// FOR UPDATE in a transaction of its own, as a relay of a store claiming with row locks holds it;
// a driver that claims otherwise replaces it, and sets Another.
func StdEnv(db *sql.DB, s store.Driver[*sql.Tx], rewrite func(string) string) *Env[*sql.Tx] {
	return &Env[*sql.Tx]{
		Store:    s,
		Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		ExecTx: func(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, rewrite(q), args...)
			return err
		},
		Exec: func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, rewrite(q), args...)
			return err
		},
		Int: func(ctx context.Context, q string, args ...any) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, rewrite(q), args...).Scan(&n)
			return n, err
		},
		HoldRow: func(t *testing.T, seq int64) func() {
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.QueryContext(ctx, rewrite(`SELECT seq FROM {{schema}}.outbox WHERE seq = ? FOR UPDATE`), seq)
			if err != nil {
				t.Fatal(err)
			}
			_ = rows.Close()
			return func() { _ = tx.Rollback() }
		},
	}
}
