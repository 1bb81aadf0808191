package pgsqlstore_test

import (
	"database/sql"
	"testing"

	_ "github.com/lib/pq" // registers the "postgres" database/sql driver
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelperProcess(t *testing.T) { storetest.HelperProcess(t) }

// Through pgx's database/sql driver, woken by NOTIFY.
func TestStorePgxStdlib(t *testing.T) { storetest.Run(t, harness("pgx", true)) }

// Through lib/pq, polling.
func TestStoreLibPQ(t *testing.T) { storetest.Run(t, harness("postgres", false)) }

func harness(driver string, listen bool) storetest.Harness[*sql.Tx] {
	return storetest.Harness[*sql.Tx]{
		Name: "pgsqlstore/" + driver,
		Open: func(t *testing.T) *storetest.Env[*sql.Tx] {
			pg := testenv.NewEmptyPG(t)
			cfg := pgsqlstore.Config{Schema: string(pg.Schema)}
			if listen {
				cfg.ListenURL = pg.URL
			}
			open := func(t *testing.T) *pgsqlstore.Store {
				db, err := sql.Open(driver, pg.URL)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				s, err := pgsqlstore.New(db, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			s := open(t)
			e := storetest.StdEnv(s.DB(), s, func(q string) string { return storetest.Rewrite(q, pg.Schema.Ident()+".", true) })
			e.Another = func(t *testing.T) store.Driver[*sql.Tx] { return open(t) }
			return e
		},
		ProcessURL: func(t *testing.T, e *storetest.Env[*sql.Tx]) (string, string) {
			return testenv.PostgresURL(t), e.Store.Info().Schema
		},
		Sessions: func(t *testing.T, want int) int { return testenv.NewEmptyPG(t).Sessions(t, want, 5) },
	}
}
