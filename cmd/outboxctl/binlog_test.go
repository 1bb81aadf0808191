package main

import (
	"strings"
	"testing"
)

// status says what is wrong with a binlog relay group in words: paused, its checkpoint's file
// purged, a lag the user may not read and the GRANT that gives it.
func TestStatusSaysWhatIsWrongWithABinlogRelay(t *testing.T) {
	lag := int64(3 << 20)
	var b strings.Builder
	err := printBinlogRelays(&b, []BinlogRelay{
		{Relay: "orders", Progress: "gtid", Position: "1-1-42", Active: true, LagBytes: &lag, CheckpointAgeSeconds: 2},
		{Relay: "billing", Progress: "file", Position: "mariadb-bin.000003:4", Paused: true, Purged: true, CheckpointAgeSeconds: 7200},
		{Relay: "audit", Progress: "gtid", Position: "1-1-9", LogError: "user 'tool'@'%' may not list the binary logs: GRANT BINLOG MONITOR ON *.* TO 'tool'@'%'"},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	for i, want := range [][]string{
		{"BINLOG RELAY", "READER", "LAG"},
		{"orders", "1-1-42", "reading", "2s ago", "3.0 MiB"},
		{"billing", "mariadb-bin.000003:4", "none (PAUSED", "2h0m0s ago", "PURGED", "recovers from the table"},
		{"audit", "none", "?"},
		{"lag unknown", "GRANT BINLOG MONITOR ON *.* TO 'tool'@'%'"},
	} {
		for _, w := range want {
			if i >= len(lines) || !strings.Contains(lines[i], w) {
				t.Fatalf("line %d lacks %q:\n%s", i, w, b.String())
			}
		}
	}
}
