package postgresbackend

import (
	"strings"
	"testing"
)

func TestPgTable_LongTopicsDoNotShareATable(t *testing.T) {
	if got := pgTable("watermill_", "orders.placed"); got != `"watermill_orders.placed"` {
		t.Errorf("a short topic's table is %s, want watermill-sql's own name", got)
	}
	long := strings.Repeat("x", 60)
	a, b := pgTable("watermill_offsets_", long+"-1"), pgTable("watermill_offsets_", long+"-2")
	if a == b {
		t.Errorf("two topics that differ after 63 bytes share the table %s", a)
	}
	for _, n := range []string{a, b} {
		if len(n)-2 > 63 {
			t.Errorf("%s is longer than Postgres's 63-byte identifiers: it would be cut", n)
		}
	}
}
