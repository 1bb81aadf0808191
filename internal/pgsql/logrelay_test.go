package pgsql

import (
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

// Every file of logrelay/ is a statement of LogRelay (event_columns.sql a part of two), rendered
// with no placeholder left: a file added and not wired, or a placeholder misspelt, fails here
// rather than at the server.
func TestLogRelayRendersEveryFile(t *testing.T) {
	q := NewLogRelay("shop")
	statements := map[string]bool{q.CreatePublication(`pub"x`): true, q.SetSnapshot("00000003-0000001B-1"): true}
	v := reflect.ValueOf(*q)
	for i := range v.NumField() {
		if v.Type().Field(i).IsExported() {
			statements[v.Field(i).String()] = true
		}
	}
	for s := range statements {
		if strings.Contains(s, "{{") || strings.Contains(s, "}}") {
			t.Errorf("a placeholder is left in:\n%s", s)
		}
	}
	files, err := fs.Glob(logRelayFiles, "logrelay/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if want := len(files) - 1; len(statements) != want { // event_columns.sql is part of others
		t.Errorf("%d statements from %d files: a file is not a statement of LogRelay", len(statements), want)
	}
	for _, f := range files {
		body := strings.TrimSpace(Render("shop", logRelayFile(strings.TrimPrefix(f, "logrelay/"))))
		// The last line of each file is in its statement (the comments above it may be its own).
		last := body[strings.LastIndex(body, "\n")+1:]
		found := false
		for s := range statements {
			found = found || strings.Contains(s, strings.NewReplacer("{{publication}}", `"pub""x"`, "{{snapshot}}", "'00000003-0000001B-1'").Replace(last))
		}
		if !found {
			t.Errorf("%s: its text is in no statement of LogRelay", f)
		}
	}
	if got, want := q.CreatePublication(`pub"x`), `CREATE PUBLICATION "pub""x" FOR TABLE "shop".outbox`; !strings.Contains(got, want) {
		t.Errorf("CreatePublication quotes its name as %q, want %q in it", got, want)
	}
	if got := q.SetSnapshot("a'b"); !strings.HasSuffix(strings.TrimSpace(got), `SET TRANSACTION SNAPSHOT 'a''b'`) {
		t.Errorf("SetSnapshot quotes its literal as %q", got)
	}
}
