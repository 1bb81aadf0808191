package prom_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/sqlitestore" // sqlite://
)

// gauges gathers reg and returns each gauge by its name and its labels' values, in the order of
// the labels' names: "outboxkit_fleet_outbox_owned{shop,orders,relay-a,acme}".
func gauges(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetValue()
			}
			out[key+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// The series of a fleet kept in a real coordination database (SQLite), through its life: a
// member takes one outbox of two, leaves, and the database goes away.
func TestFleetMetricsOnACoordinationDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "coordination.db"), store.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	fc, _ := store.FleetControlOf(st)
	if _, err := fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := fc.AcquireLease(ctx, "shop", "orders", "relay-a", time.Hour); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := fc.RecordFleetOutboxes(ctx, "shop", "relay-a", []store.FleetOutbox{
		{Name: "orders", Tenant: "acme", Pending: 4, OldestPendingAge: 3 * time.Second, StatsAt: time.Now()},
		{Name: "invoices", Tenant: "acme"},
	}, time.Hour); err != nil {
		t.Fatal(err)
	}
	m, reg := newFleetMetrics(t, fc, "shop")
	clock := time.Now()
	m.SetClock(func() time.Time { return clock })

	g := gauges(t, reg)
	for key, want := range map[string]float64{
		"outboxkit_fleet_coordination_up{shop}":                               1,
		"outboxkit_fleet_members{shop}":                                       1,
		"outboxkit_fleet_member_owned{shop,relay-a}":                          1,
		"outboxkit_fleet_outboxes{shop,owned}":                                1,
		"outboxkit_fleet_outboxes{shop,unowned}":                              1,
		"outboxkit_fleet_outbox_owned{shop,orders,relay-a,acme}":              1,
		"outboxkit_fleet_outbox_owned{shop,invoices,,acme}":                   0,
		"outboxkit_fleet_outbox_lease_token{shop,orders,acme}":                1,
		"outboxkit_fleet_outbox_owner_stale{shop,orders,acme}":                0,
		"outboxkit_fleet_outbox_pending{shop,orders,acme}":                    4,
		"outboxkit_fleet_outbox_oldest_pending_age_seconds{shop,orders,acme}": 3,
		"outboxkit_fleet_outbox_unowned_seconds{shop,orders,acme}":            0,
	} {
		if got, ok := g[key]; !ok || got != want {
			t.Errorf("%s = %v (exported: %v), want %v", key, got, ok, want)
		}
	}
	if _, ok := g["outboxkit_fleet_outbox_pending{shop,invoices,acme}"]; ok {
		t.Error("a backlog nobody read is exported")
	}
	if v, ok := g["outboxkit_fleet_outbox_unowned_seconds{shop,invoices,acme}"]; !ok || v < 0 || v > 60 {
		t.Errorf("invoices unowned for %vs (exported: %v)", v, ok)
	}

	// The member leaves: its lease is freed, nobody is live.
	if err := fc.LeaveFleet(ctx, "shop", "relay-a"); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Second)
	g = gauges(t, reg)
	for key, want := range map[string]float64{
		"outboxkit_fleet_members{shop}":                        0,
		"outboxkit_fleet_outboxes{shop,unowned}":               2,
		"outboxkit_fleet_outbox_owned{shop,orders,,acme}":      0,
		"outboxkit_fleet_outbox_lease_token{shop,orders,acme}": 1,
	} {
		if got, ok := g[key]; !ok || got != want {
			t.Errorf("after the member left: %s = %v (exported: %v), want %v", key, got, ok, want)
		}
	}

	// The coordination database is gone: coordination_up 0, and nothing else.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Second)
	g = gauges(t, reg)
	if len(g) != 1 || g["outboxkit_fleet_coordination_up{shop}"] != 0 {
		t.Errorf("with the coordination database closed: %v", g)
	}
}
