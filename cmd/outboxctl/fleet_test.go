package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// openFleet migrates a SQLite coordination database through outboxctl and returns its URL and
// FleetControl.
func openFleet(t *testing.T) (string, store.FleetControl) {
	t.Helper()
	url := "sqlite://" + filepath.Join(t.TempDir(), "coordination.db")
	if code, _, stderr := ctl(t, "--db", url, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	s, err := store.Open(context.Background(), url, store.OpenOptions{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	fc, ok := store.FleetControlOf(s)
	if !ok {
		t.Fatal("the SQLite store keeps no fleet")
	}
	return url, fc
}

// waitExpired waits, by the coordination database's clock, until member's heartbeat has expired.
func waitExpired(t *testing.T, fc store.FleetControl, fleetName, member string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		members, now, err := fc.FleetMembers(context.Background(), fleetName)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			if m.Name == member && !now.Before(m.ExpiresAt) {
				return
			}
		}
	}
	t.Fatalf("%s's heartbeat did not expire", member)
}

// A fleet with an outbox nobody owns and one held by a dead member: status names them first,
// --check fails naming them, and passes once both have a live owner (a disabled outbox without
// one is no fault).
func TestFleetStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, fc := openFleet(t)
	db := []string{"--db", url}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-a", Host: "host-a", PID: 11, Started: time.Now()}, time.Hour)
	must(err)
	_, err = fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-b", Host: "host-b", PID: 22, Started: time.Now()}, time.Millisecond)
	must(err)
	_, err = fc.FleetHeartbeat(ctx, "elsewhere", store.FleetMember{Name: "relay-z"}, time.Hour)
	must(err)
	if _, ok, err := fc.AcquireLease(ctx, "shop", "orders", "relay-a", time.Hour); err != nil || !ok {
		t.Fatalf("acquire orders: %v %v", ok, err)
	}
	if _, ok, err := fc.AcquireLease(ctx, "shop", "refunds", "relay-b", time.Hour); err != nil || !ok {
		t.Fatalf("acquire refunds: %v %v", ok, err)
	}
	must(fc.RecordFleetOutboxes(ctx, "shop", "relay-a", []store.FleetOutbox{
		{Name: "orders", Tenant: "acme", Pending: 3, OldestPendingAge: 2 * time.Second, StatsAt: time.Now()},
		{Name: "invoices", Tenant: "acme", Error: "cannot reach the database at mysql://db-7", StatsAt: time.Now()},
		{Name: "archive", Tenant: "globex", Disabled: true},
		{Name: "refunds", Tenant: "globex"},
	}, 24*time.Hour))
	waitExpired(t, fc, "shop", "relay-b")

	code, stdout, stderr := ctl(t, append(db, "fleet", "status", "--fleet", "shop")...)
	if code != 0 {
		t.Fatalf("fleet status: exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"fleet shop: 1 of 2 members live; 4 outboxes: 2 owned (1 by a STALE owner), 1 WITHOUT AN OWNER, 1 disabled",
		"WITHOUT AN OWNER (their events wait):\n  invoices (tenant acme) for ",
		": cannot reach the database at mysql://db-7\n",
		"relay-b (STALE)",
		"host-a",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("fleet status lacks %q:\n%s", want, stdout)
		}
	}
	// The outboxes table: no owner first, then a stale one, the owned, the disabled.
	var order []string
	inTable := false
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "OUTBOX ") {
			inTable = true
			continue
		}
		if inTable && line != "" {
			order = append(order, strings.Fields(line)[0])
		}
	}
	if got := strings.Join(order, " "); got != "invoices refunds orders archive" {
		t.Errorf("outboxes in the order %s, want invoices refunds orders archive:\n%s", got, stdout)
	}
	if strings.Contains(stdout, "relay-z") {
		t.Errorf("another fleet's member shown:\n%s", stdout)
	}

	code, stdout, stderr = ctl(t, append(db, "fleet", "status", "--fleet", "shop", "--check")...)
	if code != 1 || !strings.Contains(stderr, "2 outboxes need attention: invoices (tenant acme) has had no owner for ") ||
		!strings.Contains(stderr, "refunds (tenant globex) is held by relay-b") || !strings.Contains(stdout, "fleet shop:") {
		t.Fatalf("--check with an unowned and a stale outbox: exit %d\n%s%s", code, stdout, stderr)
	}

	code, stdout, _ = ctl(t, append(db, "fleet", "status", "--fleet", "shop", "--json")...)
	var st FleetStatus
	if code != 0 || json.Unmarshal([]byte(stdout), &st) != nil {
		t.Fatalf("--json: exit %d: %s", code, stdout)
	}
	if st.LiveMembers != 1 || len(st.Members) != 2 || strings.Join(st.Unowned, ",") != "invoices" || strings.Join(st.OwnerStale, ",") != "refunds" {
		t.Errorf("--json: %+v", st)
	}
	byName := map[string]FleetOutboxStatus{}
	for _, o := range st.Outboxes {
		byName[o.Name] = o
	}
	if o := byName["orders"]; o.Owner != "relay-a" || o.Token < 1 || o.Pending == nil || *o.Pending != 3 || *o.OldestPendingAgeSeconds != 2 {
		t.Errorf("orders in --json: %+v", o)
	}
	if o := byName["invoices"]; o.Owner != "" || o.UnownedForSeconds <= 0 || o.Error == "" {
		t.Errorf("invoices in --json: %+v", o)
	}
	if o := byName["archive"]; !o.Disabled || o.UnownedForSeconds != 0 || o.Pending != nil {
		t.Errorf("archive in --json: %+v", o)
	}

	// relay-b leaves (its lease freed), relay-a takes both: nothing needs attention.
	must(fc.LeaveFleet(ctx, "shop", "relay-b"))
	for _, ob := range []string{"invoices", "refunds"} {
		if _, ok, err := fc.AcquireLease(ctx, "shop", ob, "relay-a", time.Hour); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", ob, ok, err)
		}
	}
	if code, stdout, stderr := ctl(t, append(db, "fleet", "status", "--fleet", "shop", "--check")...); code != 0 || strings.Contains(stdout, "WITHOUT") {
		t.Fatalf("--check with every enabled outbox owned: exit %d\n%s%s", code, stdout, stderr)
	}
}

func TestFleetStatusMistakes(t *testing.T) {
	t.Parallel()
	url, _ := openFleet(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--db", url, "fleet", "status"}, 2, "pass --fleet NAME"},
		{[]string{"--db", url, "fleet"}, 2, "fleet takes: status"},
		{[]string{"--db", url, "fleet", "list"}, 2, `unknown command "fleet list"`},
		{[]string{"fleet", "status", "--fleet", "shop"}, 2, "pass --db"},
		{[]string{"--db", url, "fleet", "status", "--fleet", "shpo"}, 1, `fleet "shpo" is unknown to`},
		{[]string{"--db", "sqlite://" + filepath.Join(t.TempDir(), "typo.db"), "fleet", "status", "--fleet", "shop"}, 1, "the file must exist"},
	} {
		code, _, stderr := ctl(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}
}
