package forwarder_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// The claim must keep its shape on a table Postgres has no statistics for (a fresh burst of rows)
// and under custom plans, where parameters are folded in: the per-key probe must walk the key
// index. Walking the pending index instead reads the whole backlog once per key (0.7–1.5 s a pass
// at 20,000 pending rows, measured). A plan test rather than a timed one: the plan is what decides.
func TestClaimPlanUsesTheKeyIndexOnAFreshTable(t *testing.T) {
	t.Parallel()
	for _, keyed := range []string{"one event per key", "100 events per key"} {
		t.Run(keyed, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			ctx := context.Background()
			for start := 0; start < 20000; start += 1000 {
				tx, err := pg.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				pub, _ := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema), DisableNotify: true})
				var msgs []*message.Message
				for i := start; i < start+1000; i++ {
					key := fmt.Sprintf("order-%05d", i)
					if keyed != "one event per key" {
						key = fmt.Sprintf("order-%05d", i%200)
					}
					payload := fmt.Sprintf(`{"order_id":%q,"n":%d,"customer":"customer-%d","total_cents":%d}`, key, i, i%97, i*7)
					msgs = append(msgs, pipeline.NewEvent("OrderPlaced", key, []byte(payload)))
				}
				if err := pub.Publish("orders", msgs...); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			claim, err := os.ReadFile("sql/claim.sql")
			if err != nil {
				t.Fatal(err)
			}
			args := fmt.Sprintf("'%s'::timestamptz, 500", time.Now().UTC().Format(time.RFC3339Nano))
			probe := func(plan string) string {
				for _, line := range strings.Split(plan, "\n") {
					if strings.HasSuffix(strings.TrimSpace(line), " on outbox e") {
						return line
					}
				}
				return ""
			}
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				for _, park := range []bool{false, true} {
					plan := explain(t, pg, mode, pg.Schema.Render(string(claim)), fmt.Sprintf("%s, %v", args, park))
					if !strings.Contains(probe(plan), "outbox_unpublished_key_idx") {
						t.Fatalf("%s, park=%v: the per-key probe does not use the key index:\n%s", mode, park, plan)
					}
				}
			}
			// Without statistics the two indexes cost nearly the same (8.31 against 8.32 here), so the
			// choice above could go either way on another day. What must hold is that the pending
			// index is never usable for the probe: without the key index, it must not be picked.
			pg.Exec(t, `DROP INDEX {{schema}}.outbox_unpublished_key_idx`)
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				plan := explain(t, pg, mode, pg.Schema.Render(string(claim)), args+", false")
				if strings.Contains(probe(plan), "outbox_pending_idx") {
					t.Fatalf("%s: the per-key probe can walk the pending index (the whole backlog, once per key):\n%s", mode, plan)
				}
			}
		})
	}
}

func explain(t *testing.T, pg *testenv.PG, planCacheMode, query, literalArgs string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+planCacheMode); err != nil {
		t.Fatal(err)
	}
	// A named prepared statement so that plan_cache_mode applies, as in the relay's cached one.
	if _, err := tx.Prepare(ctx, "claim_plan", query); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE claim_plan("+literalArgs+")")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}
