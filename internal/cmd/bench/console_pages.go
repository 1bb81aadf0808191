package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"time"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/store"
)

// pageKind is one kind of console page, with a way to pick its random parameters.
type pageKind struct {
	name string
	path func(r *rand.Rand) string
}

func timeConsolePages(ctx context.Context, c config, db *store.DB) ([]series, []string, error) {
	con, _ := store.ConsoleOf(db)
	const token = "console-bench-operator-secret"
	h, err := console.New(console.Config{Store: db, Prefix: "/console", Auth: console.Auth{Tokens: []console.Token{{Name: "bench", Role: console.Operator, Secret: token}}},
		Publisher: discard{}, DisableJobs: true, Consumers: map[string][]string{"billing": {"shop.orders"}, "shipping": {"shop.orders"}, "search": {"shop.orders"}}})
	if err != nil {
		return nil, nil, err
	}
	// Started, as a console serving people is: it keeps its figures warm in the background.
	if err := h.Start(ctx); err != nil {
		return nil, nil, err
	}
	defer func() { _ = h.Stop(context.Background()) }() // fails only when its ctx ends first
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	get := func(path string) (time.Duration, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: %d", path, resp.StatusCode)
		}
		return d, err
	}
	// The cold overview: every figure read, nothing cached.
	cold, err := get("/console/")
	if err != nil {
		return nil, nil, err
	}
	fmt.Printf("  cold overview (every cached figure read): %s\n", cold.Round(time.Millisecond))

	// Parameters: the largest group, letters to open, positions to page from.
	groups, err := con.GroupCounts(ctx, store.LetterQuery{Side: "billing"}, 0)
	if err != nil || len(groups) == 0 {
		return nil, nil, fmt.Errorf("no failure groups (%v)", err)
	}
	largest := groups[0]
	sample, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: "billing", Limit: 200})
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	var cursors []string
	for _, l := range sample.Letters {
		ids = append(ids, l.ID)
	}
	// Deep pages: cursors spread over the 30 days.
	for i := 1; i <= 50; i++ {
		at := time.Now().Add(-time.Duration(i) * 14 * time.Hour)
		cursors = append(cursors, fmt.Sprintf("%d.c.%d", at.UnixMicro(), int64(1)<<62))
	}
	outboxDead, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox, Limit: 50})
	if err != nil || len(outboxDead.Letters) == 0 {
		return nil, nil, fmt.Errorf("no outbox dead letters (%v)", err)
	}
	pick := func(r *rand.Rand, v []string) string { return v[r.IntN(len(v))] }
	consumers := []string{"billing", "shipping", "search"}
	kinds := []pageKind{
		{"overview", func(*rand.Rand) string { return "/console/" }},
		{"letters, everywhere", func(*rand.Rand) string { return "/console/letters" }},
		{"letters, one consumer", func(r *rand.Rand) string { return "/console/letters?side=" + pick(r, consumers) }},
		{"letters, outbox", func(*rand.Rand) string { return "/console/letters?side=outbox" }},
		{"letters, largest group", func(*rand.Rand) string {
			return fmt.Sprintf("/console/letters?side=billing&group=%d", largest.FailureGroup)
		}},
		{"letters, one key", func(r *rand.Rand) string { return fmt.Sprintf("/console/letters?key=order-%d", r.IntN(200000)) }},
		{"letters, type+topic matching nothing", func(r *rand.Rand) string {
			return "/console/letters?side=billing&type=OrderPaid&topic=shop.nowhere"
		}},
		{"letters, error text", func(r *rand.Rand) string { return "/console/letters?side=" + pick(r, consumers) + "&q=billing+account" }},
		{"letters, last 6 hours", func(*rand.Rand) string { return "/console/letters?within=6h" }},
		{"letters, deep keyset page", func(r *rand.Rand) string {
			return "/console/letters?side=billing&before=" + url.QueryEscape(pick(r, cursors))
		}},
		{"detail", func(r *rand.Rand) string { return fmt.Sprintf("/console/letters/billing/%d", ids[r.IntN(len(ids))]) }},
		{"detail, outbox", func(r *rand.Rand) string {
			return fmt.Sprintf("/console/letters/outbox/%d", outboxDead.Letters[r.IntN(len(outboxDead.Letters))].ID)
		}},
		{"preview, largest group", func(*rand.Rand) string {
			return fmt.Sprintf("/console/replay/preview?side=billing&group=%d&kind=archive", largest.FailureGroup)
		}},
		{"jobs", func(*rand.Rand) string { return "/console/jobs" }},
		{"audit", func(*rand.Rand) string { return "/console/audit" }},
	}
	r := rand.New(rand.NewPCG(1, 2))
	var rows []series
	var slow []string
	fmt.Printf("  %-38s %9s %9s %9s  (ms, %d requests each, caches warm)\n", "page", "p50", "p95", "p99", c.consoleSamples)
	for _, k := range kinds {
		if _, err := get(k.path(r)); err != nil { // warm: the page's caches, the plans
			return nil, nil, fmt.Errorf("%s: %w", k.name, err)
		}
		var times []float64
		for i := 0; i < c.consoleSamples; i++ {
			d, err := get(k.path(r))
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", k.name, err)
			}
			times = append(times, float64(d.Microseconds())/1000)
		}
		slices.Sort(times)
		p := func(q float64) float64 { return times[min(len(times)-1, int(q*float64(len(times))))] }
		fmt.Printf("  %-38s %9.1f %9.1f %9.1f\n", k.name, p(0.5), p(0.95), p(0.99))
		rows = append(rows, series{Name: "console " + db.Dialect + ": " + k.name + " p95", Unit: "ms", Values: []float64{p(0.95)}})
		if p(0.95) > float64(c.consoleBudget.Milliseconds()) {
			slow = append(slow, fmt.Sprintf("%s (%.0f ms)", k.name, p(0.95)))
		}
	}
	rows = append(rows, series{Name: "console " + db.Dialect + ": cold overview", Unit: "ms", Values: []float64{float64(cold.Microseconds()) / 1000}})
	return rows, slow, nil
}
