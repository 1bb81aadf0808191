package store

import (
	"context"
	"strings"
	"testing"
)

// A program that forgot the driver's import: no driver registered.
func TestOpenNamesTheDriverToImport(t *testing.T) {
	t.Cleanup(registry.Swap())
	_, err := Open(context.Background(), "mysql://root@127.0.0.1:3306/test", OpenOptions{})
	if err == nil || !strings.Contains(err.Error(), `import _ "github.com/outboxkit/outboxkit/store/mysqlstore"`) {
		t.Fatalf("got %v, want an error naming the package to import", err)
	}
	if got := Schemes(); !strings.Contains(got, "store/allstores") {
		t.Fatalf("Schemes() = %q with no driver registered, want it to say what to import", got)
	}
}
