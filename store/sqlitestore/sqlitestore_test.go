package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelperProcess(t *testing.T) { storetest.HelperProcess(t) }

func TestStore(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		Name: "sqlitestore",
		Open: func(t *testing.T) *storetest.Env[*sql.Tx] {
			path := filepath.Join(t.TempDir(), "outboxkit.db")
			open := func(t *testing.T) *sqlitestore.Store {
				s, err := sqlitestore.Open(context.Background(), path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.DB().Close() })
				return s
			}
			s := open(t)
			e := storetest.StdEnv(s.DB(), s, func(q string) string { return storetest.Rewrite(q, "", false) })
			// Another relay's pass holds its rows by a lease, not a lock.
			e.HoldRow = func(t *testing.T, seq int64) func() {
				e.MustExec(t, `UPDATE outbox SET lease_owner = 'another relay', lease_until = '9999-12-31T00:00:00.000000Z' WHERE seq = ?`, seq)
				return func() { e.MustExec(t, `UPDATE outbox SET lease_owner = NULL, lease_until = NULL WHERE seq = ?`, seq) }
			}
			e.Another = func(t *testing.T) store.Driver[*sql.Tx] { return open(t) }
			return e
		},
		ProcessURL: func(_ *testing.T, e *storetest.Env[*sql.Tx]) (string, string) {
			return "sqlite://" + e.Store.Info().Schema, ""
		},
	})
}
