package prom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/prom"
)

type slotSource struct {
	s   forwarder.SlotStatus
	err error
}

func (f slotSource) SlotStatus(context.Context) (forwarder.SlotStatus, error) { return f.s, f.err }

// A relay's slot is exported as the server reports it; a missing one says so; one that cannot be
// read has no series.
func TestSlotCollector(t *testing.T) {
	c := prom.NewSlotCollector(
		slotSource{s: forwarder.SlotStatus{Relay: "orders", Slot: "s1", Exists: true, Active: true, WALStatus: "extended",
			LagBytes: 4096, RetainedBytes: 8192, SafeWALBytes: 1 << 20, ParkedKeys: 2, Paused: true, HeldEvents: 7}},
		slotSource{s: forwarder.SlotStatus{Relay: "billing", Slot: "s2", SafeWALBytes: -1}},
		slotSource{err: errors.New("down")},
	)
	want := `
# HELP outboxkit_log_relay_held_events Events read and held by a pause (of the relay, of their topic, or of an earlier event of their key), holding the slot's confirmed position.
# TYPE outboxkit_log_relay_held_events gauge
outboxkit_log_relay_held_events{relay="billing",slot="s2"} 0
outboxkit_log_relay_held_events{relay="orders",slot="s1"} 7
# HELP outboxkit_log_relay_parked_keys Partition keys whose oldest event backs off after a failure, holding their later events.
# TYPE outboxkit_log_relay_parked_keys gauge
outboxkit_log_relay_parked_keys{relay="billing",slot="s2"} 0
outboxkit_log_relay_parked_keys{relay="orders",slot="s1"} 2
# HELP outboxkit_log_relay_paused 1 while an operator pauses the relay group: it publishes nothing and its slot's lag grows.
# TYPE outboxkit_log_relay_paused gauge
outboxkit_log_relay_paused{relay="billing",slot="s2"} 0
outboxkit_log_relay_paused{relay="orders",slot="s1"} 1
# HELP outboxkit_log_relay_slot_active 1 while a relay reads the replication slot.
# TYPE outboxkit_log_relay_slot_active gauge
outboxkit_log_relay_slot_active{relay="billing",slot="s2"} 0
outboxkit_log_relay_slot_active{relay="orders",slot="s1"} 1
# HELP outboxkit_log_relay_slot_exists 1 when the log relay's replication slot exists, 0 when it is missing.
# TYPE outboxkit_log_relay_slot_exists gauge
outboxkit_log_relay_slot_exists{relay="billing",slot="s2"} 0
outboxkit_log_relay_slot_exists{relay="orders",slot="s1"} 1
# HELP outboxkit_log_relay_slot_lag_bytes WAL written since the slot's confirmed position, in bytes.
# TYPE outboxkit_log_relay_slot_lag_bytes gauge
outboxkit_log_relay_slot_lag_bytes{relay="orders",slot="s1"} 4096
# HELP outboxkit_log_relay_slot_retained_bytes WAL the slot keeps from removal, in bytes.
# TYPE outboxkit_log_relay_slot_retained_bytes gauge
outboxkit_log_relay_slot_retained_bytes{relay="orders",slot="s1"} 8192
# HELP outboxkit_log_relay_slot_safe_wal_bytes WAL that can still be written before the slot is invalidated (max_slot_wal_keep_size), in bytes.
# TYPE outboxkit_log_relay_slot_safe_wal_bytes gauge
outboxkit_log_relay_slot_safe_wal_bytes{relay="orders",slot="s1"} 1.048576e+06
# HELP outboxkit_log_relay_slot_wal_status 1 for the slot's wal_status.
# TYPE outboxkit_log_relay_slot_wal_status gauge
outboxkit_log_relay_slot_wal_status{relay="orders",slot="s1",status="extended"} 1
outboxkit_log_relay_slot_wal_status{relay="orders",slot="s1",status="lost"} 0
outboxkit_log_relay_slot_wal_status{relay="orders",slot="s1",status="reserved"} 0
outboxkit_log_relay_slot_wal_status{relay="orders",slot="s1",status="unreserved"} 0
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// The log relay's slot beside the forwarder's metrics: *pglog.Relay is a SlotSource.
func ExampleNewSlotCollector() {
	reg := prometheus.NewRegistry()
	// In a service: prom.NewSlotCollector(relay), relay a *pglog.Relay.
	reg.MustRegister(prom.NewSlotCollector(slotSource{s: forwarder.SlotStatus{Relay: "orders", Slot: "outboxkit_outboxkit_orders",
		Exists: true, Active: true, WALStatus: "reserved", SafeWALBytes: -1}}))
	families, _ := reg.Gather()
	for _, f := range families {
		fmt.Println(f.GetName(), len(f.GetMetric()))
	}
	// Output:
	// outboxkit_log_relay_held_events 1
	// outboxkit_log_relay_parked_keys 1
	// outboxkit_log_relay_paused 1
	// outboxkit_log_relay_slot_active 1
	// outboxkit_log_relay_slot_exists 1
	// outboxkit_log_relay_slot_lag_bytes 1
	// outboxkit_log_relay_slot_retained_bytes 1
	// outboxkit_log_relay_slot_wal_status 4
}
