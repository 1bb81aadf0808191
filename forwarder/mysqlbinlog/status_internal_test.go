package mysqlbinlog

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// The status names a group's lock as the relay takes it, short names and names past GET_LOCK's 64
// characters alike: else a group read by a relay would show no reader.
func TestStatusNamesTheLockTheRelayTakes(t *testing.T) {
	db, err := sql.Open("mysql", "u@tcp(127.0.0.1:1)/shop") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := mysqlstore.New(db, mysqlstore.Config{Schema: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"orders", strings.Repeat("billing", 10)} {
		f, err := forwarder.New(forwarder.Config{Store: st, Publisher: nopPublisher{}, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{Forwarder: f, URL: "mysql://u@127.0.0.1:1/shop"})
		if err != nil {
			t.Fatal(err)
		}
		if got := lockName("shop", name); got != r.lockName || len(got) > 64 {
			t.Errorf("group %q: the status reads lock %q, the relay takes %q", name, got, r.lockName)
		}
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
