package pgxstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelperProcess(t *testing.T) { storetest.HelperProcess(t) }

func TestStore(t *testing.T) { storetest.Run(t, harness(pgxstore.Config{})) }

// The suite again with writers that do not notify: the relay polls.
func TestStoreWithoutNotify(t *testing.T) {
	storetest.Run(t, harness(pgxstore.Config{DisableNotify: true, PollOnly: true}))
}

func harness(cfg pgxstore.Config) storetest.Harness[pgx.Tx] {
	return storetest.Harness[pgx.Tx]{
		Name: "pgxstore",
		Open: func(t *testing.T) *storetest.Env[pgx.Tx] { return open(t, cfg) },
		ProcessURL: func(_ *testing.T, e *storetest.Env[pgx.Tx]) (string, string) {
			s := e.Store.(*pgxstore.Store)
			return s.Pool().Config().ConnString(), s.Info().Namespace
		},
		Sessions: func(t *testing.T, want int) int {
			return testenv.NewEmptyPG(t).Sessions(t, want, 5)
		},
	}
}

func open(t *testing.T, cfg pgxstore.Config) *storetest.Env[pgx.Tx] {
	t.Helper()
	pg := testenv.NewEmptyPG(t)
	cfg.Schema = string(pg.Schema)
	s, err := pgxstore.New(pg.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sql := func(q string) string { return storetest.Rewrite(q, pg.Schema.Ident()+".", true) }
	return &storetest.Env[pgx.Tx]{
		Store: s,
		Another: func(t *testing.T) store.Driver[pgx.Tx] {
			pool, err := pgxpool.New(context.Background(), pg.URL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			other, err := pgxstore.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return other
		},
		Begin:    func(ctx context.Context) (pgx.Tx, error) { return pg.Pool.Begin(ctx) },
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		ExecTx: func(ctx context.Context, tx pgx.Tx, q string, args ...any) error {
			_, err := tx.Exec(ctx, sql(q), args...)
			return err
		},
		Exec: func(ctx context.Context, q string, args ...any) error {
			_, err := pg.Pool.Exec(ctx, sql(q), args...)
			return err
		},
		Int: func(ctx context.Context, q string, args ...any) (int, error) {
			var n int
			err := pg.Pool.QueryRow(ctx, sql(q), args...).Scan(&n)
			return n, err
		},
		HoldRow: func(t *testing.T, seq int64) func() {
			ctx := context.Background()
			tx, err := pg.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, sql(`SELECT 1 FROM {{schema}}.outbox WHERE seq = ? FOR UPDATE`), seq); err != nil {
				t.Fatal(err)
			}
			return func() { _ = tx.Rollback(ctx) }
		},
	}
}
