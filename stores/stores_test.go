package stores_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/stores"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ dialect, in, want string }{
		{"postgres", `SELECT a FROM t WHERE a = ? AND b = '?' AND "c?" = ?`, `SELECT a FROM t WHERE a = $1 AND b = '?' AND "c?" = $2`},
		{"mysql", `SELECT ? FROM t`, `SELECT ? FROM t`},
		{"sqlite", `SELECT ? FROM t`, `SELECT ? FROM t`},
	} {
		if got := stores.Rebind(c.dialect, c.in); got != c.want {
			t.Errorf("%s: Rebind(%q) = %q, want %q", c.dialect, c.in, got, c.want)
		}
	}
}

func TestOpenSaysWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ url, want string }{
		{"nonsense", "has no scheme"},
		{"oracle://x@y/z", `scheme "oracle" is not supported`},
		{"mysql://root@127.0.0.1:3306", "names no database"},
		{"mysql://root@127.0.0.1:3306/db?clientFoundRows=true", "clientFoundRows must stay off"},
		{"sqlite://", "names no file"},
		{"postgres://x@127.0.0.1:1/x?connect_timeout=2", "cannot reach the database"},
	} {
		db, err := stores.Open(ctx, c.url, stores.Options{})
		if err == nil {
			db.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.url, err, c.want)
		}
	}
}
