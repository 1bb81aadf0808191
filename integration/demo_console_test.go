package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

const (
	demoOperator = "demo-operator-secret-0123"
	demoViewer   = "demo-viewer-secret-456789"
)

// The scenario in the demo, on SQLite and Postgres: Billing refuses a customer's orders;
// the operator finds them in their failure group in the console, filters, fixes the cause (the demo
// restarted without --reject-customer), replays the group, and each consumer has applied each
// order once; the audit shows the replay; a viewer is refused the replay, and a POST without the
// form's token is refused.
func TestConsoleInTheDemo(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		consoleScenario(t, "sqlite://"+filepath.Join(t.TempDir(), "demo.db"), "outboxkit_demo")
	})
	t.Run("postgres", func(t *testing.T) {
		pg := testenv.NewEmptyPG(t)
		gateway := `"` + string(pg.Schema) + `_gateway"` // the payment gateway's schema, beside the demo's
		t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+gateway+" CASCADE") })
		consoleScenario(t, pg.URL, string(pg.Schema))
	})
}

// consoleDemo runs the demo binary as the scenario's service: everything in one process, on the
// in-process broker, signing in the scenario's operator and viewer; extra are more switches.
func consoleDemo(t *testing.T, dbURL, schema string, extra ...string) *demoProc {
	t.Helper()
	return runDemo(t, []string{"OUTBOXKIT_CONSOLE_TOKENS=alice:operator:" + demoOperator + ",carol:viewer:" + demoViewer},
		append([]string{"--db", dbURL, "--broker", "memory://", "--schema", schema, "--addr", "127.0.0.1:0", "--serve", "--orders", "0",
			"--rate", "50", "--status-every", "0", "--ready-max-pending-age", "1m", "--drain-deadline", "1m", "--console",
			"--relay-name", "demo"}, extra...)...)
}

// stopClean stops the demo and fails the test unless it ended as a SIGTERM asks: exit status 0.
func stopClean(t *testing.T, d *demoProc) {
	t.Helper()
	d.stop(t)
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the demo ended with exit status %d:\n%s", code, d.log())
	}
}

func consoleScenario(t *testing.T, dbURL, schema string) {
	d := consoleDemo(t, dbURL, schema, "--reject-customer", "c-0042")
	base := d.url
	db, err := store.Open(context.Background(), dbURL, store.OpenOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The demo's own tables, in its schema on Postgres; a statement in the database's dialect.
	prefix := ""
	if db.Dialect == "postgres" {
		prefix = `"` + schema + `".`
	}
	q := func(query string) string { return db.Rebind(strings.ReplaceAll(query, "{{t}}.", prefix)) }

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
		if err := db.SQL.QueryRowContext(context.Background(), q(query), args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 60*time.Second, "every consumer to handle the 30 orders (Billing dead-letters 12)", func() bool {
		w, err := db.DeadLettersWaiting(context.Background(), "billing", time.Now())
		return err == nil && w.Count == 12 && count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'billing'`) == 18 &&
			count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'shipping'`) == 30 && count(`SELECT count(*) FROM {{t}}.effects WHERE consumer = 'search'`) == 30
	})

	b := browsertest.NewTab(t)
	console := base + "/console"
	signIn := func(b *browsertest.Tab, token string) {
		b.Go(console+"/", "#token")
		b.Do(chromedp.SendKeys("#token", token))
		b.Click("#signin")
	}
	signIn(b, demoOperator)
	// The overview's figures are cached for a few seconds ("counted … ago"): read it again until
	// they include the last letters.
	testenv.Eventually(t, 60*time.Second, "the overview to count Billing's 12 dead letters", func() bool {
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

	// The cause is fixed: the demo runs again without --reject-customer, on the same database, and
	// Billing accepts the customer. The operator signs in to it (sessions are per process) and
	// replays the group.
	stopClean(t, d)
	d = consoleDemo(t, dbURL, schema)
	console = d.url + "/console"
	signIn(b, demoOperator)
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
	testenv.Eventually(t, 60*time.Second, "Billing to apply the 12 replayed orders", func() bool {
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
	testenv.Eventually(t, 60*time.Second, "Shipping and Search to absorb the replay", func() bool {
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
	testenv.Eventually(t, 60*time.Second, "the overview to say all clear after the replay", func() bool {
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
	signIn(v, demoViewer)
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
	stopClean(t, d)
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
