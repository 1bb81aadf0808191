package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/browsertest"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	browsertest.Stop()
	os.Exit(code)
}

const (
	demoOperator = "demo-operator-secret-0123"
	demoViewer   = "demo-viewer-secret-456789"
)

// The scenario in the demo, on SQLite and Postgres: Billing refuses a customer's orders;
// the operator finds them in their failure group in the console, filters, fixes the cause,
// replays the group, and each consumer has applied each order once; the audit shows the replay;
// a viewer is refused the replay, and a POST without the form's token is refused.
func TestConsoleInTheDemo(t *testing.T) {
	t.Setenv("OUTBOXKIT_CONSOLE_TOKENS", "alice:operator:"+demoOperator+",carol:viewer:"+demoViewer)
	t.Run("sqlite", func(t *testing.T) {
		consoleScenario(t, "sqlite://"+filepath.Join(t.TempDir(), "demo.db"), "outboxkit_demo")
	})
	t.Run("postgres", func(t *testing.T) {
		pg := testenv.NewEmptyPG(t)
		consoleScenario(t, pg.URL, string(pg.Schema))
	})
}

func consoleScenario(t *testing.T, dbURL, schema string) {
	ctx, cancel := context.WithCancel(context.Background())
	o := options{dbURL: dbURL, brokerURL: "memory://", schema: schema, addr: "127.0.0.1:0", role: roleAll, serve: true,
		rate: 50, statusEvery: 0, readyMaxAge: time.Minute, drainDeadline: time.Minute, rejectCustomer: "c-0042", console: true,
		relayName: "demo", live: &liveFaults{}}
	reject := "c-0042"
	o.live.rejectCustomer.Store(&reject)
	ready := make(chan string, 1)
	o.ready = func(base string) { ready <- base }
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the demo ended with %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the demo did not stop within 30s")
		}
	})
	var base string
	select {
	case base = <-ready:
	case err := <-done:
		t.Fatalf("the demo did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the demo did not start within 60s")
	}
	db, err := store.Open(context.Background(), dbURL, store.OpenOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	biz := newBusiness(db)

	// 12 orders of the customer Billing refuses, 18 of others.
	var rejected []string
	for i := 0; i < 30; i++ {
		customer := fmt.Sprintf("c-%04d", i)
		if i%5 < 2 {
			customer = "c-0042"
		}
		resp, err := http.Post(base+"/orders", "application/json", bytes.NewBufferString(fmt.Sprintf(`{"customer":%q,"total_cents":%d}`, customer, 1000+i)))
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /orders: %d %s", resp.StatusCode, body.String())
		}
		if customer == "c-0042" {
			rejected = append(rejected, between(body.String(), `"id":"`, `"`))
		}
	}
	count := func(query string, args ...any) int {
		var n int
		if err := db.SQL.QueryRowContext(context.Background(), biz.q(query), args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "every consumer to handle the 30 orders (Billing dead-letters 12)", func() bool {
		w, err := db.DeadLettersWaiting(context.Background(), "billing", time.Now())
		return err == nil && w.Count == 12 && count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'billing'`) == 18 &&
			count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'shipping'`) == 30 && count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'search'`) == 30
	})

	b := browsertest.NewTab(t)
	console := base + "/console"
	b.Go(console+"/", "#token")
	b.Do(chromedp.SendKeys("#token", demoOperator))
	b.Click("#signin")
	// The overview's figures are cached for a few seconds ("counted … ago"): read it again until
	// they include the last letters.
	waitFor(t, "the overview to count Billing's 12 dead letters", func() bool {
		b.Go(console+"/", ".verdict")
		return strings.Contains(b.Text(".verdict")+b.Text("main"), "billing has 12 dead letters waiting")
	})
	b.Shot("01-overview")
	b.Click(`.problems a[href$="/letters?side=billing"]`)
	cause := b.Text("table.groups tbody tr:first-child td.pattern")
	if !strings.HasSuffix(cause, `customer "‹…›" has no billing account (--reject-customer)`) {
		t.Fatalf("billing's largest failure group is %q", cause)
	}
	b.Shot("02-billing")
	b.Click("table.groups tbody tr:first-child a.btn:not(.outline)")
	b.Do(chromedp.SetValue(`select[name=type]`, "OrderPlaced"))
	b.Click(`form.filters button.primary`)
	if got := b.Text("#total"); got != "12 letters" {
		t.Fatalf("the group filtered by event type says %q", got)
	}
	b.Shot("03-group-filtered")
	b.Click("#list tbody tr:first-child td.num a")
	id := b.Text(".facts dd.mono") // the message id, the first fact
	if key := b.Text(`dd[title^="the Idempotency-Key"]`); key != outboxkit.OutboundKey("billing", id) {
		t.Fatalf("the detail's outbound key %q, want OutboundKey(billing, %s)", key, id)
	}
	b.Shot("04-detail")

	// The cause is fixed: Billing accepts the customer again. Replay the group.
	fixed := ""
	o.live.rejectCustomer.Store(&fixed)
	b.Go(console+"/letters?side=billing", "table.groups")
	b.Click("table.groups tbody tr:first-child a.outline")
	if h := b.Text("h1"); h != "Replay 12 dead letters?" {
		t.Fatalf("the preview says %q", h)
	}
	b.Shot("05-preview")
	b.Do(chromedp.SetValue(`select[name=rate]`, "1000"))
	b.Click("#start")
	b.WaitFor(`document.querySelector("#state") && document.querySelector("#state").textContent.includes("done")`, 60*time.Second)
	if got := b.Text("#done"); got != "12" {
		t.Fatalf("the job did %s, want 12", got)
	}
	b.Shot("06-job-done")

	// Each consumer applies each order once: Billing the 12 it had refused, Shipping and Search
	// nothing more (they absorb the replay in their inbox).
	waitFor(t, "Billing to apply the 12 replayed orders", func() bool {
		return count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'billing'`) == 30
	})
	for _, c := range []string{"shipping", "billing", "search"} {
		if n := count(`SELECT count(*) FROM (SELECT order_id FROM {{t}}.effects WHERE consumer = ? GROUP BY order_id HAVING count(*) > 1) AS twice`, c); n != 0 {
			t.Errorf("%s applied %d orders more than once", c, n)
		}
		if n := count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = ?`, c); n != 30 {
			t.Errorf("%s applied %d effects, want 30", c, n)
		}
	}
	for _, order := range rejected {
		if n := count(`SELECT count(*) FROM {{t}}.invoices WHERE order_id = ?`, order); n != 1 {
			t.Errorf("order %s has %d invoices after the replay, want 1", order, n)
		}
	}
	waitFor(t, "Shipping and Search to absorb the replay", func() bool {
		stats, err := db.ConsumerStats(context.Background(), time.Now())
		if err != nil {
			return false
		}
		absorbed := 0
		for _, s := range stats {
			if s.Consumer == "shipping" || s.Consumer == "search" {
				absorbed += int(s.Duplicates)
			}
		}
		return absorbed >= 24
	})

	b.Go(console+"/audit", "table")
	b.Shot("07-audit")
	if got := b.Text("tbody"); !strings.Contains(got, "alice") || !strings.Contains(got, "12 replayed") {
		t.Fatalf("the audit: %q", got)
	}
	waitFor(t, "the overview to say all clear after the replay", func() bool {
		b.Go(console+"/", ".verdict")
		return strings.Contains(b.Text(".verdict"), "All clear")
	})
	b.Shot("08-overview-after")

	// A POST without the form's token, from the operator's own page: refused.
	b.Go(console+"/letters", "#list")
	status := browsertest.Eval[float64](b, `fetch("letters/act", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
		body: "action=replay&id=billing:1"}).then(r => r.status)`)
	if status != http.StatusForbidden {
		t.Errorf("a POST without the CSRF token: %v, want 403", status)
	}
	// The viewer: no replay, even posted by hand with a valid token.
	v := browsertest.NewTab(t)
	v.Go(console+"/", "#token")
	v.Do(chromedp.SendKeys("#token", demoViewer))
	v.Click("#signin")
	v.Go(console+"/letters?side=billing&archived=0", "#list")
	status = browsertest.Eval[float64](v, `(() => { const csrf = document.querySelector("input[name=csrf]").value;
		return fetch("letters/act", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
		  body: "csrf=" + encodeURIComponent(csrf) + "&action=replay&id=billing:1"}).then(r => r.status); })()`)
	if status != http.StatusForbidden {
		t.Errorf("a viewer's replay: %v, want 403", status)
	}
	v.Go(console+"/audit", "table")
	v.Shot("09-audit-viewer-refused")
	if row := v.Text("tbody tr:first-child"); !strings.Contains(row, "carol") || !strings.Contains(row, "refused") {
		t.Errorf("the audit's newest row = %q, want carol's refusal", row)
	}
	var _ *sql.DB
}

func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	s = s[i+len(from):]
	if j := strings.Index(s, to); j >= 0 {
		s = s[:j]
	}
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 60s for %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polling the database with a deadline
	}
}
