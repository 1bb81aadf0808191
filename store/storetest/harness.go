// Package storetest is the conformance suite every store driver passes, as River's
// riverdrivertest is for its drivers: the whole of outboxkit — publisher, forwarder, consumer
// middleware, idempotency keys, migrations — run against one driver on a real database. A driver's
// tests call Run with a Harness that makes fresh stores of its own.
//
// Statements the suite runs itself are written once for every dialect: ? placeholders, and
// {{schema}}. before the names of outboxkit's tables and the suite's own.
package storetest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every database URL
)

// Harness makes stores of one driver for the suite.
type Harness[TTx any] struct {
	// Name names the driver in the suite's output.
	Name string
	// Open returns a store of its own for one test (its own schema, database or file), empty and
	// not migrated, dropped when the test ends.
	Open func(t *testing.T) *Env[TTx]
	// ProcessURL, when set, returns the store.Open URL and schema that reach env's store from
	// another process, for the test of migrations run by several processes at once.
	ProcessURL func(t *testing.T, env *Env[TTx]) (url, schema string)
	// Sessions is how many sessions, up to want, a test may hold at once (the server's spare
	// connections); nil: want.
	Sessions func(t *testing.T, want int) int
}

// Env is one test's store and the means to look at it.
type Env[TTx any] struct {
	Store store.Driver[TTx]
	// Another returns a second store over the same database on a pool of its own: another relay
	// process, as far as the database can tell.
	Another func(t *testing.T) store.Driver[TTx]

	// Begin, Commit and Rollback drive the application's transactions.
	Begin    func(ctx context.Context) (TTx, error)
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
	// ExecTx runs a statement in the application's transaction.
	ExecTx func(ctx context.Context, tx TTx, query string, args ...any) error
	// Exec runs a statement on its own.
	Exec func(ctx context.Context, query string, args ...any) error
	// Int runs a query that returns one integer.
	Int func(ctx context.Context, query string, args ...any) (int, error)
	// HoldRow keeps outbox row seq from other relays as a relay in the middle of a pass would,
	// until release.
	HoldRow func(t *testing.T, seq int64) (release func())
}

// migrated opens a store and migrates it.
func migrated[TTx any](t *testing.T, h Harness[TTx]) *Env[TTx] {
	t.Helper()
	e := h.Open(t)
	if _, err := e.Store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return e
}

// MustExec runs a statement and fails the test on error.
func (e *Env[TTx]) MustExec(t testing.TB, query string, args ...any) {
	t.Helper()
	if err := e.Exec(context.Background(), query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// MustInt runs a query that returns one integer and fails the test on error.
func (e *Env[TTx]) MustInt(t testing.TB, query string, args ...any) int {
	t.Helper()
	n, err := e.Int(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	return n
}

// InTx runs fn in an application transaction and commits it; fn's error rolls it back.
func (e *Env[TTx]) InTx(ctx context.Context, fn func(tx TTx) error) error {
	tx, err := e.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = e.Rollback(ctx, tx)
		return err
	}
	return e.Commit(ctx, tx)
}

func (h Harness[TTx]) sessions(t *testing.T, want int) int {
	if h.Sessions == nil {
		return want
	}
	return h.Sessions(t, want)
}

// waitFor polls cond until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// helperEnv is the environment variable that turns a test binary into the suite's helper process.
const helperEnv = "OUTBOXKIT_STORETEST_HELPER"

// HelperProcess is the body of a driver test package's TestHelperProcess: it does what the suite
// asks of another process (migrate), and nothing when the test binary is not such a process.
func HelperProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return
	}
	runHelper(t, spec)
}

// Rewrite turns one of the suite's statements into a dialect's: {{schema}}. becomes prefix (a
// quoted schema or database and a dot, or nothing), and with dollar each ? outside quotes becomes
// $1, $2, … in order.
func Rewrite(query, prefix string, dollar bool) string {
	query = strings.ReplaceAll(query, "{{schema}}.", prefix)
	if dollar {
		query = store.Rebind("postgres", query)
	}
	return query
}
