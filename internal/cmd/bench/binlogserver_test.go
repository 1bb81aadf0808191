package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseStatus(t *testing.T) {
	c, err := parseStatus([][2]string{{"Com_select", "12"}, {"Questions", "40"}, {"Com_delete", "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if c["Questions"] != 40 || c["Com_select"] != 12 || c["Com_delete"] != 0 {
		t.Fatalf("parsed %v", c)
	}
	if _, err := parseStatus([][2]string{{"Questions", "4x"}}); err == nil || !strings.Contains(err.Error(), "Questions") {
		t.Fatalf("a value that is no number: err = %v, want one naming the variable", err)
	}
	if _, err := parseStatus([][2]string{{"Com_select", "1"}}); err == nil {
		t.Fatal("no Questions counter: want an error, not a total of zero")
	}
}

// The relay's statements are a window's change less the bench's own read and the writers' share,
// per event.
func TestStatementsTakeOutTheBenchAndTheWriters(t *testing.T) {
	before := statusCounters{"Questions": 1000, "Com_select": 100, "Com_insert": 50, "Com_show_status": 7}
	after := statusCounters{"Questions": 1000 + 1 + 400 + 20, "Com_select": 100 + 10, "Com_insert": 50 + 200 + 10, "Com_show_status": 8,
		"Com_delete": 5}
	oneRead := statusCounters{"Questions": 1, "Com_show_status": 1}
	writers := stmtRates{"Questions": 4, "Com_insert": 2} // per event, 100 events
	got := statements(before, after, oneRead, 100, writers)
	if math.Abs(got.total()-0.2) > 1e-9 {
		t.Fatalf("total = %v, want 0.2 (20 statements over 100 events)", got.total())
	}
	if math.Abs(got["Com_insert"]-0.1) > 1e-9 || math.Abs(got["Com_select"]-0.1) > 1e-9 || math.Abs(got["Com_delete"]-0.05) > 1e-9 {
		t.Fatalf("by kind = %v, want insert 0.1, select 0.1, delete 0.05", got)
	}
	if v := got["Com_show_status"]; v != 0 {
		t.Fatalf("the bench's own read counted: show_status %v", v)
	}
	if s := writers.scaled(3); s.total() != 12 || s["Com_insert"] != 6 {
		t.Fatalf("scaled = %v", s)
	}
}

func TestStatementKinds(t *testing.T) {
	r := stmtRates{"Questions": 0.3, "Com_select": 0.1, "Com_delete": 0.15, "Com_insert": 0.1, "Com_stmt_execute": 0.3,
		"Com_update": 0.00001}
	if got, want := r.kinds(), "delete 0.1500, insert 0.1000, select 0.1000"; got != want {
		t.Fatalf("kinds = %q, want %q (most first, ties by name; the prepared statements' commands and what rounds to zero left out)", got, want)
	}
	if got := (stmtRates{"Questions": 0}).kinds(); got != "none" {
		t.Fatalf("kinds of nothing = %q, want none", got)
	}
}

func TestParseProcStat(t *testing.T) {
	// A thread named with a space and a parenthesis: fields are counted from the last ')'.
	line := "4242 (one (conn) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 75 0 0 20 0 38 0 1234 0 0"
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want {
		t.Fatalf("CPU = %s, want %s (utime 250 + stime 75 ticks of 10 ms)", got, want)
	}
	if _, err := parseProcStat("4242 (x) S 1 2"); err == nil {
		t.Fatal("a short line: want an error")
	}
}

func TestTCPPorts(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:D2F0 0100007F:CF0E 01 00000000:00000000 00:00000000 00000000     0        0 14099 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:0CEA 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   106        0 7154 1 0000000000000000 20 4 30 10 -1
`
	got := tcpPorts(table, map[string]bool{"14099": true})
	if len(got) != 1 || !got[0xD2F0] {
		t.Fatalf("ports = %v, want only %d (the socket whose inode is ours)", got, 0xD2F0)
	}
}
