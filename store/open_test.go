package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ dialect, in, want string }{
		{"postgres", `SELECT a FROM t WHERE a = ? AND b = '?' AND "c?" = ?`, `SELECT a FROM t WHERE a = $1 AND b = '?' AND "c?" = $2`},
		{"mysql", `SELECT ? FROM t`, `SELECT ? FROM t`},
		{"sqlite", `SELECT ? FROM t`, `SELECT ? FROM t`},
	} {
		if got := store.Rebind(c.dialect, c.in); got != c.want {
			t.Errorf("%s: Rebind(%q) = %q, want %q", c.dialect, c.in, got, c.want)
		}
	}
}

func TestOpenSaysWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	missing := t.TempDir() + "/missing.db"
	for _, c := range []struct {
		url  string
		opts store.OpenOptions
		want string
	}{
		{"nonsense", store.OpenOptions{}, "has no scheme"},
		{"oracle://x@y/z", store.OpenOptions{}, `scheme "oracle" is not supported`},
		{"mysql://root@127.0.0.1:3306", store.OpenOptions{}, "names no database"},
		{"mysql://root@127.0.0.1:3306/db?clientFoundRows=true", store.OpenOptions{}, "clientFoundRows must stay off"},
		{"sqlite://", store.OpenOptions{}, "names no file"},
		{"sqlite://" + missing, store.OpenOptions{MustExist: true}, "the file must exist"},
		{"mysql://root@127.0.0.1:3306/db", store.OpenOptions{SQLDriver: "pgx"}, "do not apply to mysql://: SQLDriver"},
		{"postgres://x@127.0.0.1:1/x", store.OpenOptions{SQLDriver: "postgres"}, `import _ "github.com/lib/pq"`},
		{"postgres://x@127.0.0.1:1/x?connect_timeout=2", store.OpenOptions{}, "cannot reach the database"},
		{"postgres://x:secret@127.0.0.1:1/x?connect_timeout=2", store.OpenOptions{}, "x:***@"},
	} {
		db, err := store.Open(ctx, c.url, c.opts)
		if err == nil {
			db.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
}
