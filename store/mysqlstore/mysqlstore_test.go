package mysqlstore_test

import (
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelperProcess(t *testing.T) { storetest.HelperProcess(t) }

func TestStore(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		Name: "mysqlstore",
		Open: func(t *testing.T) *storetest.Env[*sql.Tx] {
			m := testenv.NewMySQL(t)
			open := func(t *testing.T) *mysqlstore.Store {
				s, err := mysqlstore.New(testenv.OpenMySQL(t, m.URL), mysqlstore.Config{Schema: m.Database})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			s := open(t)
			e := storetest.StdEnv(s.DB(), s, func(q string) string { return storetest.Rewrite(q, "`"+m.Database+"`.", false) })
			e.Another = func(t *testing.T) store.Driver[*sql.Tx] { return open(t) }
			return e
		},
		ProcessURL: func(t *testing.T, e *storetest.Env[*sql.Tx]) (string, string) {
			return testenv.MySQLURL(t), e.Store.Info().Schema
		},
		Sessions: func(_ *testing.T, want int) int { return min(want, 40) },
	})
}
