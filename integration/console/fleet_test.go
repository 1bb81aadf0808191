package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
	"github.com/outboxkit/outboxkit/internal/consoletest"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// fleetSite is consoletest's fleet, grown to what an operator meets: a second member, one that
// died holding a lease, an outbox its owner cannot open, and a few more tenants, served under
// /ops of a test server.
func fleetSite(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	f := consoletest.SeedFleet(t)
	fc := f.Control
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-2", Host: "host-2", PID: 202, Started: time.Now().Add(-3 * time.Hour)}, time.Hour)
	must(err)
	_, err = fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-3", Host: "host-3", PID: 303, Started: time.Now().Add(-time.Hour)}, time.Millisecond)
	must(err)
	var recorded []store.FleetOutbox
	for i, name := range []string{"hooli", "massive-dynamic", "soylent", "stark", "umbrella", "wayne", "wonka"} {
		f.Catalog = append(f.Catalog, fleet.Outbox{Name: name, URL: "sqlite:///nowhere/" + name + ".db"})
		o := store.FleetOutbox{Name: name, Tenant: name, Pending: int64(i * 37), OldestPendingAge: time.Duration(i*11) * time.Second, StatsAt: time.Now()}
		owner := []string{"relay-1", "relay-2"}[i%2]
		switch name {
		case "umbrella":
			o.Error, o.Pending, o.OldestPendingAge = "cannot reach the database at postgres://relay@db-3:5432/shop: connection refused", 0, 0
		case "soylent":
			owner = "relay-3" // died holding it: a stale owner until its lease expires
			o.Pending, o.OldestPendingAge = 1204, 3*time.Minute+12*time.Second
		}
		_, ok, err := fc.AcquireLease(ctx, "shop", name, owner, time.Hour)
		if err != nil || !ok {
			t.Fatalf("acquire %s for %s: %v %v", name, owner, ok, err)
		}
		recorded = append(recorded, o)
	}
	must(fc.RecordFleetOutboxes(ctx, "shop", "relay-2", recorded, time.Hour))
	testenv.Eventually(t, 10*time.Second, "relay-3's heartbeat to expire", func() bool {
		members, now, err := fc.FleetMembers(ctx, "shop")
		if err != nil {
			return false
		}
		for _, m := range members {
			if m.Name == "relay-3" {
				return !now.Before(m.ExpiresAt)
			}
		}
		return false
	})
	h := f.Handler(t, func(c *console.FleetConfig) { c.Console.Environment = "production" })
	mux := http.NewServeMux()
	mux.Handle("/ops/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/ops"
}

// The operator opens the fleet's page, sees the outbox nobody relays first and highlighted,
// filters by tenant, opens that tenant's dead letters, switches to another tenant, and goes back
// to the fleet. Every page is kept as a screenshot.
func TestFleetOperatorFindsTheUnownedOutboxAndATenantsLetters(t *testing.T) {
	base := fleetSite(t)
	b := browsertest.NewTab(t)
	b.Do(chromedp.EmulateViewport(1440, 900))
	signIn(b, base, consoletest.OperatorToken)
	b.Shot("20-fleet")
	if got := b.Text("#verdict"); !strings.Contains(got, "1 outbox has no owner") {
		t.Fatalf("the fleet's verdict: %q", got)
	}
	first := browsertest.Eval[[]string](b, `[...document.querySelector("table.fleet tbody tr").classList, document.querySelector("table.fleet tbody tr").dataset.outbox]`)
	if fmt.Sprint(first) != "[unowned initech]" {
		t.Fatalf("the first outbox listed: %v, want the unowned initech", first)
	}
	// Highlighted: not only a word, a colour that stands out from the rows below.
	bg := browsertest.Eval[[]string](b, `[...document.querySelectorAll("table.fleet tbody tr")].slice(0, 3).map(r => getComputedStyle(r.cells[0]).backgroundColor)`)
	if bg[0] == bg[2] {
		t.Errorf("the unowned row's background %s is that of an owned one", bg[0])
	}
	order := browsertest.Eval[[]string](b, `[...document.querySelectorAll("table.fleet tbody tr")].slice(0, 4).map(r => r.className + ":" + r.dataset.outbox)`)
	if fmt.Sprint(order) != "[unowned:initech stale:soylent failing:umbrella owned:acme]" {
		t.Errorf("what needs an operator first: %v", order)
	}
	if got := b.Text(`table.fleet tr[data-outbox="soylent"]`); !strings.Contains(got, "stale owner") {
		t.Errorf("soylent, held by a dead member: %q", got)
	}
	if got := b.Text("#members tbody"); !strings.Contains(got, "relay-3") || !strings.Contains(got, "expired") {
		t.Errorf("members: %q", got)
	}
	b.Dark(true)
	b.Shot("21-fleet-dark")
	b.Dark(false)

	b.Do(chromedp.SendKeys("#fleet-filter", "acm"))
	b.Click("#filter")
	b.Shot("22-fleet-filtered")
	if rows := browsertest.Eval[[]string](b, `[...document.querySelectorAll("table.fleet tbody tr")].map(r => r.dataset.outbox)`); fmt.Sprint(rows) != "[acme]" {
		t.Fatalf("filtered by acm: %v", rows)
	}
	b.Click(`table.fleet a.tenant-link`)
	if got := b.Text("#tenant-name"); got != "acme" {
		t.Fatalf("the tenant's header names %q", got)
	}
	b.Shot("23-tenant-overview")
	b.Click(`.top nav a[href$="/t/acme/letters"]`)
	b.Shot("24-tenant-letters")
	letters := b.Text("main")
	if !strings.Contains(letters, "has no billing account") || strings.Contains(letters, consoletest.GlobexReason) {
		t.Fatalf("acme's dead letters: billing's group %t, globex's letter %t", strings.Contains(letters, "has no billing account"),
			strings.Contains(letters, consoletest.GlobexReason))
	}

	// The switcher, on the same page of another tenant.
	b.Do(chromedp.SendKeys("#switch-tenant", "globex"))
	b.Click("#switcher button")
	if got := browsertest.Eval[string](b, `location.pathname`); got != "/ops/t/globex/letters" {
		t.Fatalf("the switcher went to %s", got)
	}
	b.Shot("25-switched-to-globex")
	if got := b.Text("main"); !strings.Contains(got, consoletest.GlobexReason) || strings.Contains(got, "has no billing account") {
		t.Fatalf("globex's dead letters: %.300q", got)
	}

	b.Do(chromedp.EmulateViewport(1024, 768))
	b.Shot("27-tenant-narrow")
	b.Do(chromedp.EmulateViewport(1440, 900))

	b.Click("#fleet-link")
	if got := b.Text("h1"); got != "Fleet shop" {
		t.Fatalf("back at the fleet: %q", got)
	}
	b.Go(base+"/t/nobody/", "#notice")
	b.Shot("26-unknown-tenant")
	if got := b.Text("h1"); !strings.Contains(got, `No tenant "nobody"`) {
		t.Fatalf("an unknown tenant: %q", got)
	}
}
