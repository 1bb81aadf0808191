package prom_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// A member's forwarders, one per outbox on stores of one schema name: each has its own series
// and no backlog read from its store, so an outbox whose store is closed (relayed elsewhere now)
// breaks no scrape; its circuit state goes with its lease, its counters stay.
func TestMemberMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	mm, err := prom.NewMemberMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]*store.DB{}
	relay := func(outbox string) *forwarder.Forwarder {
		t.Helper()
		st, err := store.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), outbox+".db"), store.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if _, err := pipeline.Migrate(ctx, st); err != nil {
			t.Fatal(err)
		}
		stores[outbox] = st
		f, err := forwarder.New(forwarder.Config{Store: st, Publisher: nopPublisher{}, Name: outbox, Metrics: mm.Forwarder(outbox)})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	relay("acme")
	relay("globex")
	mm.LeaseAcquired("acme", 1)
	mm.LeaseAcquired("globex", 1)
	circuits := func() int {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, "outboxkit_forwarder_circuit_state")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := circuits(); n != 2 {
		t.Fatalf("%d circuit series, want one per outbox", n)
	}
	if n, err := testutil.GatherAndCount(reg, "outboxkit_outbox_pending"); err != nil || n != 0 {
		t.Fatalf("backlog series of a member's forwarder: %d, %v", n, err)
	}

	// acme's lease is lost and its store closed: no scrape error, no circuit state of it.
	mm.LeaseLost("acme", "taken by another member")
	_ = stores["acme"].Close()
	if n := circuits(); n != 1 {
		t.Fatalf("%d circuit series after acme's lease was lost, want 1", n)
	}
	// Acquired again: its circuit state is back.
	relay("acme")
	mm.RelayFailed("acme", context.Canceled)
	if n := circuits(); n != 2 {
		t.Fatalf("%d circuit series after acme was acquired again, want 2", n)
	}
	want := `
# HELP outboxkit_fleet_member_leases_acquired_total Leases the member acquired: it began to relay the outbox.
# TYPE outboxkit_fleet_member_leases_acquired_total counter
outboxkit_fleet_member_leases_acquired_total 2
# HELP outboxkit_fleet_member_leases_lost_total Leases the member lost without freeing them: taken by another member, or not renewed in time.
# TYPE outboxkit_fleet_member_leases_lost_total counter
outboxkit_fleet_member_leases_lost_total 1
# HELP outboxkit_fleet_member_leases_released_total Leases the member freed: the outbox handed over to another member, disabled or removed from the catalog.
# TYPE outboxkit_fleet_member_leases_released_total counter
outboxkit_fleet_member_leases_released_total 0
# HELP outboxkit_fleet_member_relay_failures_total Failures to open an outbox the member holds, or of its relay; each is tried again.
# TYPE outboxkit_fleet_member_relay_failures_total counter
outboxkit_fleet_member_relay_failures_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outboxkit_fleet_member_leases_acquired_total",
		"outboxkit_fleet_member_leases_lost_total", "outboxkit_fleet_member_leases_released_total", "outboxkit_fleet_member_relay_failures_total"); err != nil {
		t.Fatal(err)
	}
	mm.LeaseReleased("globex")
	if n := circuits(); n != 1 {
		t.Fatalf("%d circuit series after globex was released, want 1", n)
	}
}
