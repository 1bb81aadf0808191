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
			return s.Pool().Config().ConnString(), s.Info().Schema
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
	e := storetest.PgxEnv(pg.Pool, s, func(q string) string { return storetest.Rewrite(q, pg.Schema.Ident()+".", true) })
	e.Another = func(t *testing.T) store.Driver[pgx.Tx] {
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
	}
	return e
}
