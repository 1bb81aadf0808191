package mysqlbinlog

import (
	"strings"
	"testing"
)

// A group's lock is named after its database and name, within GET_LOCK's 64 characters; names
// past them keep a start an operator recognises, and stay apart. (The relay and the status take
// the name from lockName both; TestStatusShowsTheCheckpointItsReaderAndItsLag sees a running
// relay's lock through the status.)
func TestLockNamesFitGetLockAndStayApart(t *testing.T) {
	if got, want := lockName("shop", "orders"), "outboxkit.binlog.shop.orders"; got != want {
		t.Errorf("lock of group orders: got %q, want %q", got, want)
	}
	long := strings.Repeat("billing", 10)
	a, b := lockName("shop", long+"-a"), lockName("shop", long+"-b")
	for _, n := range []string{a, b} {
		if len(n) > 64 || !strings.HasPrefix(n, "outboxkit.binlog.shop.billing") {
			t.Errorf("lock name %q: longer than 64 characters, or without the group's start", n)
		}
	}
	if a == b {
		t.Errorf("groups %q and %q share the lock %q", long+"-a", long+"-b", a)
	}
}

// The lag is the rest of the checkpoint's file and every later file; a file no longer listed is
// purged.
func TestLagSinceCountsTheRestOfTheFileAndTheLaterOnes(t *testing.T) {
	logs := []binaryLog{{"b.000001", 1000}, {"b.000002", 500}, {"b.000003", 300}}
	for _, c := range []struct {
		file   string
		pos    uint64
		lag    int64
		purged bool
	}{
		{"b.000002", 200, 300 + 300, false},
		{"b.000003", 300, 0, false},
		{"b.000001", 4, 996 + 500 + 300, false},
		{"b.000000", 4, -1, true},
		{"", 0, -1, false},
	} {
		lag, purged := lagSince(logs, c.file, c.pos)
		if lag != c.lag || purged != c.purged {
			t.Errorf("%s:%d: lag %d, purged %v; want %d, %v", c.file, c.pos, lag, purged, c.lag, c.purged)
		}
	}
}
