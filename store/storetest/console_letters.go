package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

func consoleListing[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	clk, _ := deadOutbox(t, e, []string{"o-1", "o-2", "o-3"}, 2) // 6 outbox letters, all at clk's instant
	base := clk.Now().Add(-time.Hour)
	for i := 0; i < 20; i++ {
		// Pairs share an instant, and one instant is the outbox's: ties across consumers and sides.
		at := base.Add(time.Duration(i/2) * time.Minute)
		if i == 19 {
			at = clk.Now()
		}
		deadLetter(t, e, "billing", fmt.Sprintf("b-%02d", i), fmt.Sprintf("k-%d", i%5), "OrderPlaced", int64(100+i),
			fmt.Sprintf(`customer "c-%04d" has no billing account`, i), at)
	}
	for i := 0; i < 10; i++ {
		deadLetter(t, e, "search", fmt.Sprintf("s-%02d", i), fmt.Sprintf("k-%d", i%5), "OrderPlaced", int64(200+i),
			"decode OrderPlaced: invalid character 'x' looking for beginning of value", base.Add(time.Duration(i)*time.Minute))
	}
	for _, tc := range []struct {
		q    store.LetterQuery
		want int
	}{
		{store.LetterQuery{Limit: 4}, 36},
		{store.LetterQuery{Side: "billing", Limit: 3}, 20},
		{store.LetterQuery{Side: store.SideConsumers, Limit: 7}, 30},
		{store.LetterQuery{Side: store.SideOutbox, Limit: 4}, 6},
		{store.LetterQuery{PartitionKey: "k-1", Limit: 2}, 6},
		{store.LetterQuery{Side: "search", PartitionKey: "o-1"}, 0},
	} {
		if got := everyPage(t, c, tc.q); len(got) != tc.want {
			t.Errorf("%+v: %d letters over every page, want %d", tc.q, len(got), tc.want)
		}
		n, capped, err := c.CountDeadLetters(ctx, tc.q, -1)
		if err != nil || n != int64(tc.want) || capped {
			t.Errorf("%+v: count %d (capped %v, %v), want %d", tc.q, n, capped, err, tc.want)
		}
	}
	if n, capped, err := c.CountDeadLetters(ctx, store.LetterQuery{}, 10); err != nil || n != 10 || !capped {
		t.Errorf("count capped at 10: %d, capped %v, %v", n, capped, err)
	}

	groups, err := c.GroupCounts(ctx, store.LetterQuery{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	billing, _ := store.FailureGroupOf("OrderPlaced", `customer "c-0001" has no billing account`)
	outbox, _ := store.FailureGroupOf("Happened", errBroken.Error())
	want := map[letterKey]int64{{"billing", billing}: 20, {store.SideOutbox, outbox}: 6}
	for _, g := range groups {
		if g.Side == "search" {
			continue
		}
		if want[letterKey{g.Side, g.FailureGroup}] != g.Count {
			t.Errorf("group %s/%d holds %d letters; want %v", g.Side, g.FailureGroup, g.Count, want)
		}
		delete(want, letterKey{g.Side, g.FailureGroup})
	}
	if len(want) > 0 || len(groups) != 3 {
		t.Fatalf("groups %+v: missing %v (the group ids must be store.FailureGroupOf's on every database)", groups, want)
	}
	byGroup := everyPage(t, c, store.LetterQuery{Side: "billing", FailureGroup: billing, ByGroup: true, Limit: 6})
	if len(byGroup) != 20 {
		t.Fatalf("billing's group lists %d letters, want 20", len(byGroup))
	}
	ex, err := c.GroupExample(ctx, store.SideOutbox, outbox)
	if err != nil || ex.Reason != errBroken.Error() || ex.EventType != "Happened" {
		t.Fatalf("outbox group example: %+v, %v", ex, err)
	}

	// The detail: a payload cut to the bound asked, its size told; an id that is not there.
	d, err := c.DeadLetter(ctx, "billing", byGroup[0].ID, 5)
	if err != nil || len(d.Payload) != 5 || d.PayloadSize <= 5 || d.Metadata["outboxkit_event_type"] != "OrderPlaced" || d.PartitionKey == "" {
		t.Fatalf("detail: %+v, %v", d, err)
	}
	if _, err := c.DeadLetter(ctx, "billing", 1<<40, 10); !errors.Is(err, store.ErrNoLetter) {
		t.Fatalf("a letter that is not there: %v, want ErrNoLetter", err)
	}
	if _, err := c.DeadLetter(ctx, "search", byGroup[0].ID, 10); !errors.Is(err, store.ErrNoLetter) {
		t.Fatalf("billing's letter read as search's: %v, want ErrNoLetter", err)
	}
	totals, err := c.DeadLetterTotals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int64{}
	for _, tt := range totals {
		sum[tt.Side] += tt.Count
	}
	if sum["billing"] != 20 || sum["search"] != 10 || sum[store.SideOutbox] != 6 {
		t.Fatalf("totals %+v", totals)
	}
}

// A filter no index serves (error text, topic, event type) reads a bounded number of letters
// per page and says where it stopped; following the cursor finds every match exactly once.
func consoleBoundedScan[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	base := time.Now().Add(-time.Hour)
	want := map[int64]bool{}
	for i := 0; i < 40; i++ {
		reason := "timeout talking to the warehouse"
		if i%7 == 0 {
			reason = "customer has no billing account"
		}
		deadLetter(t, e, "billing", fmt.Sprintf("m-%02d", i), "k", "OrderPlaced", int64(i+1), reason, base.Add(time.Duration(i)*time.Second))
	}
	q := store.LetterQuery{ErrorContains: "billing account", ScanLimit: 5, Limit: 50}
	stopped := 0
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("the bounded scan did not end")
		}
		p, err := c.ListDeadLetters(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if p.ScanStopped {
			stopped++
		}
		for _, l := range p.Letters {
			if want[l.ID] {
				t.Fatalf("letter %d found twice", l.ID)
			}
			want[l.ID] = true
		}
		if p.Next.IsZero() {
			break
		}
		q.Before = p.Next
	}
	if len(want) != 6 || stopped < 5 {
		t.Fatalf("found %d of 6 matches, %d pages stopped at the bound (want at least 5)", len(want), stopped)
	}
	groups, err := c.GroupCounts(context.Background(), store.LetterQuery{ErrorContains: "billing account"}, 10)
	if err != nil || len(groups) != 1 || groups[0].Count != 1 {
		t.Fatalf("groups of the 10 newest letters that match: %+v, %v (want 1 letter: only m-35 is among them)", groups, err)
	}
}

func consoleRegroup[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	deadLetter(t, e, "billing", "m-1", "k-9", "OrderPaid", 7, `customer "c-1" is blocked`, time.Now())
	deadOutbox(t, e, []string{"o"}, 1)
	// As stored before the console's migration.
	e.MustExec(t, `UPDATE {{schema}}.dead_letters SET failure_group = NULL, event_type = NULL, partition_key = NULL, source_seq = 0`)
	e.MustExec(t, `UPDATE {{schema}}.outbox SET failure_group = NULL, event_type = NULL`)
	n, err := c.Regroup(ctx, 10)
	if err != nil || n != 2 {
		t.Fatalf("regrouped %d (%v), want 2", n, err)
	}
	if n, err := c.Regroup(ctx, 10); err != nil || n != 0 {
		t.Fatalf("regrouped %d again (%v), want 0", n, err)
	}
	g, _ := store.FailureGroupOf("OrderPaid", `customer "c-2" is blocked`)
	got := everyPage(t, c, store.LetterQuery{Side: "billing", FailureGroup: g, ByGroup: true, PartitionKey: "k-9"})
	if len(got) != 1 || got[0].EventType != "OrderPaid" {
		t.Fatalf("the regrouped letter by group and key: %+v", got)
	}
	og, _ := store.FailureGroupOf("Happened", errBroken.Error())
	if got := everyPage(t, c, store.LetterQuery{Side: store.SideOutbox, FailureGroup: og, ByGroup: true}); len(got) != 1 {
		t.Fatalf("the regrouped outbox letter: %+v", got)
	}
}
