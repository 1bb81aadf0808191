package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// Schema is a Postgres schema name a test owns.
type Schema string

// Ident is the schema's quoted identifier.
func (s Schema) Ident() string { return `"` + string(s) + `"` }

// Render replaces {{schema}} in sql with the quoted schema name.
func (s Schema) Render(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", s.Ident()) }

// PG is a migrated outboxkit schema of its own for one test, on the shared server.
type PG struct {
	URL    string
	Schema Schema
	Pool   *pgxpool.Pool
	DB     *sql.DB         // database/sql over Pool
	Store  *pgxstore.Store // outboxkit's store in Schema
}

// NewPG creates a fresh schema, migrates it and drops it when the test ends, so tests can run in
// parallel on one server.
func NewPG(t testing.TB) *PG {
	t.Helper()
	pg := NewEmptyPG(t)
	if _, err := pg.Store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", pg.Schema, err)
	}
	return pg
}

// NewEmptyPG is NewPG without the migration: the schema name is reserved and dropped at the end,
// but nothing is created.
func NewEmptyPG(t testing.TB) *PG {
	t.Helper()
	return newEmptyPGAt(t, PostgresURL(t))
}

// NewLogicalPG is NewPG on the server with wal_level = logical (PGLogicalURL), for the log relay.
func NewLogicalPG(t testing.TB) *PG {
	t.Helper()
	pg := newEmptyPGAt(t, PGLogicalURL(t))
	if _, err := pg.Store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", pg.Schema, err)
	}
	return pg
}

// NewLogicalPGAt is NewLogicalPG on the server at url (a private cluster a test started itself).
func NewLogicalPGAt(t testing.TB, url string) *PG {
	t.Helper()
	pg := newEmptyPGAt(t, url)
	if _, err := pg.Store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", pg.Schema, err)
	}
	return pg
}

func newEmptyPGAt(t testing.TB, url string) *PG {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	pg := newPG(t, url, Schema(UniqueName(t, "t")), pool)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pg.Schema.Ident()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", pg.Schema, err)
		}
		_ = pg.DB.Close()
		pool.Close()
	})
	return pg
}

// AttachPG opens a schema another process of the test made (a helper process's view of its
// parent's schema). It closes the pool at the end but drops nothing.
func AttachPG(t testing.TB, url, schemaName string) *PG {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	pg := newPG(t, url, Schema(schemaName), pool)
	t.Cleanup(func() { _ = pg.DB.Close(); pool.Close() })
	return pg
}

// PostgresTopicURL is the test server's URL with search_path set to a fresh, empty schema that
// is dropped when the test ends: the tables of a watermill-sql topic (backends.Open with
// postgres://) land there instead of piling up in public.
func PostgresTopicURL(t testing.TB) string {
	t.Helper()
	pg := NewEmptyPG(t)
	pg.Exec(t, "CREATE SCHEMA "+pg.Schema.Ident())
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatalf("parse %s: %v", pg.URL, err)
	}
	q := u.Query()
	q.Set("search_path", string(pg.Schema))
	u.RawQuery = q.Encode()
	return u.String()
}

// Exec runs a statement (rendered for the test's schema) and fails the test on error.
func (pg *PG) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := pg.Pool.Exec(context.Background(), pg.Schema.Render(sql), args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// Int runs a query (rendered for the test's schema) that returns one integer.
func (pg *PG) Int(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(sql), args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

// UniqueName returns a lowercase identifier unique to this test run, for schemas, queues,
// exchanges and topics.
func UniqueName(t testing.TB, prefix string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
		if b.Len() >= 20 {
			break
		}
	}
	return fmt.Sprintf("%s_%s_%x_%x_%d", prefix, b.String(), os.Getpid(), time.Now().UnixNano()&0xffffff,
		nameSeq.Add(1))
}

var nameSeq atomic.Int64

// Sessions returns how many sessions, up to want, a test may hold at once on the shared server
// without starving the tests of other packages running beside it: the server's max_connections,
// less its reserved slots, the sessions open now and a margin of 30. It waits up to a minute for
// room for want; then it settles for what there is, failing the test below least.
func (pg *PG) Sessions(t testing.TB, want, least int) int {
	t.Helper()
	const margin = 30
	free := 0
	deadline := time.Now().Add(time.Minute)
	for {
		free = pg.Int(t, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
			- (SELECT count(*) FROM pg_stat_activity)::int`) - margin
		if free >= want || time.Now().After(deadline) {
			break
		}
		<-time.After(200 * time.Millisecond)
	}
	if free < least {
		t.Fatalf("only %d sessions free on the server (max_connections less those in use and a margin); the test needs %d", free, least)
	}
	return min(want, free)
}

func newPG(t testing.TB, url string, schema Schema, pool *pgxpool.Pool) *PG {
	t.Helper()
	st, err := pgxstore.New(pool, pgxstore.Config{Schema: string(schema)})
	if err != nil {
		pool.Close()
		t.Fatalf("store in schema %s: %v", schema, err)
	}
	return &PG{URL: url, Schema: schema, Pool: pool, DB: stdlib.OpenDBFromPool(pool), Store: st}
}

// StoreOn is outboxkit's store in the test's schema on a pool of the caller's (another process's
// sessions, named to be killed, say).
func (pg *PG) StoreOn(t testing.TB, pool *pgxpool.Pool) *pgxstore.Store {
	t.Helper()
	s, err := pgxstore.New(pool, pgxstore.Config{Schema: string(pg.Schema)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
