package pglog

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outboxkit/outboxkit/store"
)

// A full window whose head is held keeps its events not done and the last transaction end of each
// run of done ones; what it drops still counts when the head moves past it, so the confirmed
// position and the count of items done (the idle confirmation's guard) are those of the whole
// stream.
func TestCompactKeepsPositionsAndCounts(t *testing.T) {
	d := newDispatcher(&session{r: &Relay{cfg: Config{Window: 6}}})
	ev := func(id string) item { return item{row: store.OutboxRow{UUID: id, Topic: "t"}, delKey: id} }
	end := func(lsn pglogrepl.LSN) item { return item{end: lsn} }
	for _, it := range []item{ev("held"), end(10), ev("a"), end(20), ev("b"), end(30), ev("c"), ev("open")} {
		if err := d.add(context.Background(), it); err != nil {
			t.Fatal(err)
		}
	}
	done := func(i int) { d.window.fifo[i].done = true; d.window.doneBehind++ }
	done(2) // a
	done(4) // b
	done(6) // c: of the transaction still open
	d.advance()
	if d.window.len() != 3 { // held, end 30 (standing for end 10, a, end 20, b, and c), open
		t.Fatalf("window %d after compaction, want 3", d.window.len())
	}
	if !slices.Equal(d.checkpoint.del, []string{"a", "b", "c"}) {
		t.Fatalf("rows to remove %v, want a, b, c", d.checkpoint.del)
	}
	if d.window.popped != 0 || d.checkpoint.confirmable != 0 {
		t.Fatalf("popped %d, confirmable %s before the head is done", d.window.popped, d.checkpoint.confirmable)
	}
	d.window.fifo[d.window.head].done = true // held, published
	d.advance()
	if d.checkpoint.confirmable != 30 || d.window.popped != 7 {
		t.Fatalf("confirmable %s, popped %d; want 0/1E and 7 (every item before the open one)", d.checkpoint.confirmable, d.window.popped)
	}
}
