package mysql

import (
	"reflect"
	"testing"

	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// A migration splits as the mysql client reads it: at ";" at a line's end, and around a
// procedure at the delimiter a DELIMITER line sets, the procedure's own ";" kept.
func TestStatementsKeepAProcedureWhole(t *testing.T) {
	got := statements(`-- a comment
DROP PROCEDURE IF EXISTS p;

DELIMITER //
CREATE PROCEDURE p()
BEGIN
    SELECT 1;
    SELECT 2;
END //
DELIMITER ;
CREATE TABLE t (id INT);
`)
	want := []string{"-- a comment\nDROP PROCEDURE IF EXISTS p", "CREATE PROCEDURE p()\nBEGIN\n    SELECT 1;\n    SELECT 2;\nEND", "CREATE TABLE t (id INT)"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("statements = %q, want %q", got, want)
	}
	// Without a DELIMITER line, as every migration before the procedure's is split.
	for _, m := range sqlstore.ParseMigrations(files, "migrations") {
		if m.Name != "publish" && !reflect.DeepEqual(statements(m.SQL), sqlstore.Statements(m.SQL)) {
			t.Errorf("%04d_%s splits otherwise than before", m.Version, m.Name)
		}
	}
}
