package fleetstores

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newHandles() *handles {
	return &handles{opts: options{maxConns: 4, logMode: "table"}, sql: map[string]*sqlHandle{}, pools: map[string]*poolHandle{}}
}

// refs is how many outboxes use each handle.
func (h *handles) refs() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for _, e := range h.sql {
		out = append(out, e.refs)
	}
	for _, e := range h.pools {
		out = append(out, e.refs)
	}
	return out
}

// checkShared opens outboxes, all on one database, and checks that they share one handle, that
// each store reaches its tables, and that the handle is closed with the last of them.
func checkShared(t *testing.T, h *handles, outboxes []fleet.Outbox) {
	t.Helper()
	ctx := context.Background()
	var opened []fleet.Opened
	for _, o := range outboxes {
		op, err := h.open(ctx, o)
		if err != nil {
			t.Fatalf("open %s: %v", o.Name, err)
		}
		if err := op.Store.CheckSchema(ctx); err != nil {
			t.Errorf("outbox %s: %v", o.Name, err)
		}
		if got := op.Store.Info().Schema; !strings.Contains(got, o.Schema) {
			t.Errorf("outbox %s: store in %q, want %q", o.Name, got, o.Schema)
		}
		opened = append(opened, op)
	}
	if got := h.refs(); len(got) != 1 || got[0] != len(outboxes) {
		t.Fatalf("%d outboxes on one database: handles used %v times, want one handle used %d times", len(outboxes), got, len(outboxes))
	}
	for i, op := range opened {
		if err := op.Close(); err != nil {
			t.Fatal(err)
		}
		if err := op.Close(); err != nil { // a second Close does nothing
			t.Fatal(err)
		}
		want := len(outboxes) - i - 1
		if got := h.refs(); (want == 0 && len(got) != 0) || (want > 0 && (len(got) != 1 || got[0] != want)) {
			t.Fatalf("after %d closes: handles used %v times, want %d", i+1, got, want)
		}
	}
}

func TestOpener_SQLiteOutboxesOfOneFileShareItsHandle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	st, err := sqlitestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.DB().Close() }()
	if _, err := pipeline.Migrate(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	checkShared(t, newHandles(), []fleet.Outbox{{Name: "a", URL: "sqlite://" + path}, {Name: "b", URL: "sqlite://" + path}})
}

// Two hundred tenants' schemas on one database are one pool, not two hundred.
func TestOpener_PostgresSchemasOfOneDatabaseShareItsHandle(t *testing.T) {
	url := testenv.PostgresURL(t)
	var outboxes []fleet.Outbox
	for i := range 3 {
		pg := testenv.NewPG(t)
		outboxes = append(outboxes, fleet.Outbox{Name: fmt.Sprintf("tenant-%d", i), URL: url, Schema: string(pg.Schema)})
	}
	checkShared(t, newHandles(), outboxes)
}

func TestOpener_MySQLDatabasesOfOneServerShareItsHandle(t *testing.T) {
	var outboxes []fleet.Outbox
	var url string
	for i := range 2 {
		my := testenv.NewMySQL(t)
		s, err := mysqlstore.New(my.DB, mysqlstore.Config{Schema: my.Database})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pipeline.Migrate(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		if url == "" {
			url = my.URL // the server, whichever database its connections start in
		}
		outboxes = append(outboxes, fleet.Outbox{Name: fmt.Sprintf("tenant-%d", i), URL: url, Schema: my.Database})
	}
	checkShared(t, newHandles(), outboxes)
}

// What cannot be opened says why, and leaves no handle behind.
func TestOpener_SaysWhyItCannotOpen(t *testing.T) {
	h := newHandles()
	for url, want := range map[string]string{
		"nowhere":                            "has no scheme",
		"redis://127.0.0.1:6379":             "is not one of postgres://, mysql://, sqlite://",
		"sqlite://":                          "names no file",
		"postgres://u:secret@127.0.0.1:1/db": "cannot reach the database at postgres://u:***@127.0.0.1:1/db",
	} {
		_, err := h.open(context.Background(), fleet.Outbox{Name: "x", URL: url, Schema: "outboxkit", Relay: fleet.RelayPoll})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want it to say %q", url, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the password: %v", url, err)
		}
	}
	if got := h.refs(); len(got) != 0 {
		t.Errorf("handles left after failed opens: %v", got)
	}
}
