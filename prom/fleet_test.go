package prom_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// fakeFleet is a coordination database that answers reads with what it is given and counts them.
type fakeFleet struct {
	store.FleetControl // the writes: unused here, nil (a call panics)

	mu       sync.Mutex
	now      time.Time
	members  []store.FleetMember
	leases   []store.Lease
	outboxes []store.FleetOutbox
	err      error
	reads    int
}

func (f *fakeFleet) FleetMembers(context.Context, string) ([]store.FleetMember, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.members, f.now, f.err
}

func (f *fakeFleet) FleetLeases(context.Context, string) ([]store.Lease, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases, f.now, f.err
}

func (f *fakeFleet) FleetOutboxes(context.Context, string) ([]store.FleetOutbox, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outboxes, f.now, f.err
}

func (f *fakeFleet) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// A fleet of two members, one of them dead, and four outboxes: one owned and read, one never
// owned, one disabled, one whose owner died holding its lease.
func newFakeFleet() *fakeFleet {
	now := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	ttl := 10 * time.Second
	return &fakeFleet{
		now: now,
		members: []store.FleetMember{
			{Name: "relay-a", HeartbeatAt: now.Add(-2 * time.Second), ExpiresAt: now.Add(8 * time.Second)},
			{Name: "relay-b", HeartbeatAt: now.Add(-20 * time.Second), ExpiresAt: now.Add(-10 * time.Second)},
		},
		leases: []store.Lease{
			{Outbox: "orders", Owner: "relay-a", Token: 3, AcquiredAt: now.Add(-90 * time.Second), RenewedAt: now.Add(-time.Second), ExpiresAt: now.Add(ttl - time.Second)},
			{Outbox: "refunds", Owner: "relay-b", Token: 7, AcquiredAt: now.Add(-time.Hour), RenewedAt: now.Add(-5 * time.Second), ExpiresAt: now.Add(5 * time.Second)},
		},
		outboxes: []store.FleetOutbox{
			{Name: "orders", Tenant: "acme", FirstRecordedAt: now.Add(-time.Hour), Pending: 12, OldestPendingAge: 1500 * time.Millisecond, StatsAt: now.Add(-2 * time.Second)},
			{Name: "invoices", Tenant: "acme", FirstRecordedAt: now.Add(-45 * time.Second)},
			{Name: "archive", Tenant: "globex", Disabled: true, FirstRecordedAt: now.Add(-time.Hour)},
			{Name: "refunds", Tenant: "globex", FirstRecordedAt: now.Add(-time.Hour), Error: "cannot reach the database", StatsAt: now.Add(-30 * time.Second)},
		},
	}
}

const fakeFleetWant = `
# HELP outboxkit_fleet_coordination_up 1 when the fleet's coordination database answered the scrape's read, 0 when it did not (then no other fleet series is exported).
# TYPE outboxkit_fleet_coordination_up gauge
outboxkit_fleet_coordination_up{fleet="shop"} 1
# HELP outboxkit_fleet_member_owned Outboxes a live member holds a lease on.
# TYPE outboxkit_fleet_member_owned gauge
outboxkit_fleet_member_owned{fleet="shop",member="relay-a"} 1
# HELP outboxkit_fleet_members Live members of the fleet: their heartbeat has not expired.
# TYPE outboxkit_fleet_members gauge
outboxkit_fleet_members{fleet="shop"} 1
# HELP outboxkit_fleet_outbox_error 1 when the owner's last attempt to open or read the outbox failed.
# TYPE outboxkit_fleet_outbox_error gauge
outboxkit_fleet_outbox_error{fleet="shop",outbox="archive",tenant="globex"} 0
outboxkit_fleet_outbox_error{fleet="shop",outbox="invoices",tenant="acme"} 0
outboxkit_fleet_outbox_error{fleet="shop",outbox="orders",tenant="acme"} 0
outboxkit_fleet_outbox_error{fleet="shop",outbox="refunds",tenant="globex"} 1
# HELP outboxkit_fleet_outbox_lease_age_seconds How long the outbox's owner has held its lease; 0 when unowned.
# TYPE outboxkit_fleet_outbox_lease_age_seconds gauge
outboxkit_fleet_outbox_lease_age_seconds{fleet="shop",outbox="archive",tenant="globex"} 0
outboxkit_fleet_outbox_lease_age_seconds{fleet="shop",outbox="invoices",tenant="acme"} 0
outboxkit_fleet_outbox_lease_age_seconds{fleet="shop",outbox="orders",tenant="acme"} 90
outboxkit_fleet_outbox_lease_age_seconds{fleet="shop",outbox="refunds",tenant="globex"} 3600
# HELP outboxkit_fleet_outbox_lease_token The outbox's fencing token: one more at each change of owner (the last one given, when unowned).
# TYPE outboxkit_fleet_outbox_lease_token gauge
outboxkit_fleet_outbox_lease_token{fleet="shop",outbox="archive",tenant="globex"} 0
outboxkit_fleet_outbox_lease_token{fleet="shop",outbox="invoices",tenant="acme"} 0
outboxkit_fleet_outbox_lease_token{fleet="shop",outbox="orders",tenant="acme"} 3
outboxkit_fleet_outbox_lease_token{fleet="shop",outbox="refunds",tenant="globex"} 7
# HELP outboxkit_fleet_outbox_oldest_pending_age_seconds Age of the oldest outbox row waiting to be published, as the outbox's owner last read it.
# TYPE outboxkit_fleet_outbox_oldest_pending_age_seconds gauge
outboxkit_fleet_outbox_oldest_pending_age_seconds{fleet="shop",outbox="orders",tenant="acme"} 1.5
outboxkit_fleet_outbox_oldest_pending_age_seconds{fleet="shop",outbox="refunds",tenant="globex"} 0
# HELP outboxkit_fleet_outbox_owned 1 while owner holds the outbox's lease; 0, with owner "", while nobody does.
# TYPE outboxkit_fleet_outbox_owned gauge
outboxkit_fleet_outbox_owned{fleet="shop",outbox="archive",owner="",tenant="globex"} 0
outboxkit_fleet_outbox_owned{fleet="shop",outbox="invoices",owner="",tenant="acme"} 0
outboxkit_fleet_outbox_owned{fleet="shop",outbox="orders",owner="relay-a",tenant="acme"} 1
outboxkit_fleet_outbox_owned{fleet="shop",outbox="refunds",owner="relay-b",tenant="globex"} 1
# HELP outboxkit_fleet_outbox_owner_stale 1 when the outbox's owner has not renewed its lease, or its heartbeat, within the lease's term.
# TYPE outboxkit_fleet_outbox_owner_stale gauge
outboxkit_fleet_outbox_owner_stale{fleet="shop",outbox="archive",tenant="globex"} 0
outboxkit_fleet_outbox_owner_stale{fleet="shop",outbox="invoices",tenant="acme"} 0
outboxkit_fleet_outbox_owner_stale{fleet="shop",outbox="orders",tenant="acme"} 0
outboxkit_fleet_outbox_owner_stale{fleet="shop",outbox="refunds",tenant="globex"} 1
# HELP outboxkit_fleet_outbox_pending Outbox rows waiting to be published, as the outbox's owner last read them.
# TYPE outboxkit_fleet_outbox_pending gauge
outboxkit_fleet_outbox_pending{fleet="shop",outbox="orders",tenant="acme"} 12
outboxkit_fleet_outbox_pending{fleet="shop",outbox="refunds",tenant="globex"} 0
# HELP outboxkit_fleet_outbox_stats_age_seconds How old the owner's last reading of the outbox's backlog is.
# TYPE outboxkit_fleet_outbox_stats_age_seconds gauge
outboxkit_fleet_outbox_stats_age_seconds{fleet="shop",outbox="orders",tenant="acme"} 2
outboxkit_fleet_outbox_stats_age_seconds{fleet="shop",outbox="refunds",tenant="globex"} 30
# HELP outboxkit_fleet_outbox_unowned_seconds How long an enabled outbox has had no owner; 0 while owned or disabled.
# TYPE outboxkit_fleet_outbox_unowned_seconds gauge
outboxkit_fleet_outbox_unowned_seconds{fleet="shop",outbox="archive",tenant="globex"} 0
outboxkit_fleet_outbox_unowned_seconds{fleet="shop",outbox="invoices",tenant="acme"} 45
outboxkit_fleet_outbox_unowned_seconds{fleet="shop",outbox="orders",tenant="acme"} 0
outboxkit_fleet_outbox_unowned_seconds{fleet="shop",outbox="refunds",tenant="globex"} 0
# HELP outboxkit_fleet_outboxes Outboxes of the fleet's catalog by state: owned, unowned (enabled and relayed by nobody), disabled.
# TYPE outboxkit_fleet_outboxes gauge
outboxkit_fleet_outboxes{fleet="shop",state="disabled"} 1
outboxkit_fleet_outboxes{fleet="shop",state="owned"} 2
outboxkit_fleet_outboxes{fleet="shop",state="unowned"} 1
`

func newFleetMetrics(t *testing.T, fc store.FleetControl, name string) (*prom.FleetMetrics, *prometheus.Registry) {
	t.Helper()
	m, err := prom.NewFleetMetrics(fc, name)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	return m, reg
}

// Each outbox is exported as fleet.Status tells it: owner, how long unowned, a dead owner's stale
// lease, the token, and the backlog only where an owner read it.
func TestFleetMetricsSeries(t *testing.T) {
	t.Parallel()
	_, reg := newFleetMetrics(t, newFakeFleet(), "shop")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fakeFleetWant)); err != nil {
		t.Fatal(err)
	}
}

// Scrapes within a second share one read of the coordination database, concurrent ones too; a
// later scrape reads again.
func TestFleetMetricsShareARead(t *testing.T) {
	t.Parallel()
	fc := newFakeFleet()
	m, reg := newFleetMetrics(t, fc, "shop")
	var mu sync.Mutex
	clock := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	m.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := fc.readCount(); n != 1 {
		t.Fatalf("8 scrapes at once read the coordination database %d times, want 1", n)
	}
	mu.Lock()
	clock = clock.Add(999 * time.Millisecond)
	mu.Unlock()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := fc.readCount(); n != 1 {
		t.Fatalf("a scrape 999ms after a read read again: %d reads", n)
	}
	mu.Lock()
	clock = clock.Add(time.Millisecond)
	mu.Unlock()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := fc.readCount(); n != 2 {
		t.Fatalf("a scrape a second after a read did not read again: %d reads", n)
	}
}

// When the coordination database cannot be read, only coordination_up 0 is exported, not the
// figures of an earlier read; they come back with the database.
func TestFleetMetricsCoordinationDown(t *testing.T) {
	t.Parallel()
	fc := newFakeFleet()
	m, reg := newFleetMetrics(t, fc, "shop")
	clock := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	m.SetClock(func() time.Time { return clock })
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fakeFleetWant)); err != nil {
		t.Fatal(err)
	}
	fc.mu.Lock()
	fc.err = errors.New("connection refused")
	fc.mu.Unlock()
	clock = clock.Add(2 * time.Second)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outboxkit_fleet_coordination_up 1 when the fleet's coordination database answered the scrape's read, 0 when it did not (then no other fleet series is exported).
# TYPE outboxkit_fleet_coordination_up gauge
outboxkit_fleet_coordination_up{fleet="shop"} 0
`)); err != nil {
		t.Fatal(err)
	}
	fc.mu.Lock()
	fc.err = nil
	fc.mu.Unlock()
	clock = clock.Add(2 * time.Second)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fakeFleetWant)); err != nil {
		t.Fatal(err)
	}
}

// Two fleets share a registry; the same fleet twice is refused; a missing database or name is
// refused at once, saying what to pass.
func TestNewFleetMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	for _, name := range []string{"shop", "billing"} {
		m, err := prom.NewFleetMetrics(newFakeFleet(), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(m); err != nil {
			t.Fatalf("fleet %s: %v", name, err)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "outboxkit_fleet_members"); err != nil || n != 2 {
		t.Fatalf("two fleets: %d members series, %v", n, err)
	}
	again, _ := prom.NewFleetMetrics(newFakeFleet(), "shop")
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(again); !errors.As(err, &are) {
		t.Fatalf("the same fleet twice: %v, want AlreadyRegisteredError", err)
	}
	if _, err := prom.NewFleetMetrics(nil, "shop"); err == nil || !strings.Contains(err.Error(), "FleetControlOf") {
		t.Errorf("nil coordination database: %v", err)
	}
	if _, err := prom.NewFleetMetrics(newFakeFleet(), ""); err == nil || !strings.Contains(err.Error(), "fleet's name") {
		t.Errorf("no fleet name: %v", err)
	}
}
