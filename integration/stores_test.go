package integration

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// testDB is one migrated store and the means to look at it, whatever the database: the failure
// matrix and the conformance run go through it once per store.
type testDB interface {
	// Name names the store in test names and tables.
	Name() string
	// Dialect is "postgres", "mysql" or "sqlite": the DDL the test's own tables need.
	Dialect() string
	Store() store.Store
	// Another is a store over the same database on a pool of its own, as another process's.
	Another(t testing.TB) store.Store
	// Exec runs a statement written with ? placeholders and {{schema}}. before table names.
	Exec(t testing.TB, query string, args ...any)
	// Int runs such a query returning one integer.
	Int(t testing.TB, query string, args ...any) int
	// Write commits msgs into the outbox on topic, in one transaction.
	Write(t testing.TB, topic string, msgs []*message.Message)
	// Effect is a handler that runs one statement of insert's in the inbox's transaction.
	Effect(insert func(ctx context.Context, m *message.Message) (query string, args []any)) message.NoPublishHandlerFunc
}

// envDB is a testDB over a storetest.Env.
type envDB[TTx any] struct {
	name, dialect string
	env           *storetest.Env[TTx]
}

func (d *envDB[TTx]) Name() string                          { return d.name }
func (d *envDB[TTx]) Dialect() string                       { return d.dialect }
func (d *envDB[TTx]) Store() store.Store                    { return d.env.Store }
func (d *envDB[TTx]) Another(t testing.TB) store.Store      { return d.env.Another(t.(*testing.T)) }
func (d *envDB[TTx]) Exec(t testing.TB, q string, a ...any) { d.env.MustExec(t, q, a...) }
func (d *envDB[TTx]) Int(t testing.TB, q string, a ...any) int {
	return d.env.MustInt(t, q, a...)
}

func (d *envDB[TTx]) Write(t testing.TB, topic string, msgs []*message.Message) {
	t.Helper()
	if err := d.env.InTx(context.Background(), func(tx TTx) error {
		pub, err := pipeline.NewPublisher(d.env.Store, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		return pub.Publish(topic, msgs...)
	}); err != nil {
		t.Fatalf("write %d events: %v", len(msgs), err)
	}
}

func (d *envDB[TTx]) Effect(insert func(ctx context.Context, m *message.Message) (string, []any)) message.NoPublishHandlerFunc {
	return handlers.JSON(func(ctx context.Context, tx TTx, _ map[string]any) error {
		m, _ := handlers.MessageFrom(ctx)
		q, args := insert(ctx, m)
		return d.env.ExecTx(ctx, tx, q, args...)
	})
}

// pgDB is the test's Postgres schema through pgx, as most tests use it.
func pgDB(pg *testenv.PG) testDB {
	e := storetest.PgxEnv(pg.Pool, pg.Store, func(q string) string { return storetest.Rewrite(q, pg.Schema.Ident()+".", true) })
	e.Another = func(t *testing.T) store.Driver[pgx.Tx] {
		pool, err := pgxpool.New(context.Background(), pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pg.StoreOn(t, pool)
	}
	return &envDB[pgx.Tx]{name: "pgx", dialect: "postgres", env: e}
}

// everyStore opens, migrated and empty, each store the library has: Postgres through pgx and
// through database/sql, MariaDB (or MySQL) and SQLite.
func everyStore(t *testing.T) []func(t *testing.T) testDB {
	return []func(t *testing.T) testDB{
		func(t *testing.T) testDB { return pgDB(testenv.NewPG(t)) },
		func(t *testing.T) testDB {
			pg := testenv.NewEmptyPG(t)
			return openDB(t, "postgres-sql", pg.URL, string(pg.Schema), pg.Schema.Ident()+".")
		},
		func(t *testing.T) testDB {
			m := testenv.NewMySQL(t)
			return openDB(t, "mysql", m.URL, m.Database, "`"+m.Database+"`.")
		},
		func(t *testing.T) testDB {
			return openDB(t, "sqlite", "sqlite://"+filepath.Join(t.TempDir(), "outboxkit.db"), "", "")
		},
	}
}

// storeNames names everyStore's stores, in order.
var storeNames = []string{"pgx", "postgres-sql", "mysql", "sqlite"}

// openDB opens a store by URL (as a service would, with store.Open) and migrates it.
func openDB(t *testing.T, name, url, schema, prefix string) testDB {
	t.Helper()
	open := func(t *testing.T) *store.DB {
		db, err := store.Open(context.Background(), url, store.OpenOptions{Schema: schema})
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open(t)
	if _, err := pipeline.Migrate(context.Background(), db); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	e := storetest.StdEnv(db.SQL, db, func(q string) string { return db.Rebind(storetest.Rewrite(q, prefix, false)) })
	e.Another = func(t *testing.T) store.Driver[*sql.Tx] { return open(t) }
	return &envDB[*sql.Tx]{name: name, dialect: db.Dialect, env: e}
}

// effectsDDL is the table the effect consumers write to, one row per applied event, in each
// dialect: n orders the rows as they were applied; (consumer, message_id) is unique, so a
// duplicate effect fails loudly.
func effectsDDL(dialect string) string {
	switch dialect {
	case "mysql":
		return `CREATE TABLE {{schema}}.effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(100) NOT NULL,
			message_id VARCHAR(255) NOT NULL, pkey VARCHAR(255) NOT NULL, seq BIGINT NOT NULL, UNIQUE (consumer, message_id))`
	case "sqlite":
		return `CREATE TABLE {{schema}}.effects (n INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT NOT NULL,
			message_id TEXT NOT NULL, pkey TEXT NOT NULL, seq INTEGER NOT NULL, UNIQUE (consumer, message_id))`
	}
	return `CREATE TABLE {{schema}}.effects (n bigserial PRIMARY KEY, consumer text NOT NULL,
		message_id text NOT NULL, pkey text NOT NULL, seq bigint NOT NULL, UNIQUE (consumer, message_id))`
}
