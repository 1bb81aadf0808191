package prom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/forwarder"
)

// SlotSource reads a log relay's replication slot: *pglog.Relay (package forwarder/pglog).
type SlotSource interface {
	SlotStatus(ctx context.Context) (forwarder.SlotStatus, error)
}

// NewSlotCollector exports, at each scrape, the replication slot of each log relay, as the server
// sees it:
//
//	outboxkit_log_relay_slot_exists{relay, slot}               0 when the slot is missing
//	outboxkit_log_relay_slot_active{relay, slot}               1 while a relay reads it
//	outboxkit_log_relay_slot_lag_bytes{relay, slot}            WAL written since its confirmed position
//	outboxkit_log_relay_slot_retained_bytes{relay, slot}       WAL it keeps from removal
//	outboxkit_log_relay_slot_safe_wal_bytes{relay, slot}       WAL left before it is invalidated (absent when unlimited)
//	outboxkit_log_relay_slot_wal_status{relay, slot, status}   1 for its wal_status (reserved, extended, unreserved, lost)
//	outboxkit_log_relay_parked_keys{relay, slot}               keys backing off after a failure of their oldest event
//	outboxkit_log_relay_paused{relay, slot}                    1 while an operator pauses the relay group
//	outboxkit_log_relay_held_events{relay, slot}               events read and held by a pause (they hold the slot's position)
//
// The commit→publish time is the forwarder's outboxkit_forwarder_commit_to_confirm_seconds
// (NewForwarderMetrics). A slot that cannot be read at a scrape has no series in it.
func NewSlotCollector(sources ...SlotSource) prometheus.Collector {
	return &slotCollector{sources: sources}
}

var (
	slotLabels       = []string{"relay", "slot"}
	slotExistsDesc   = prometheus.NewDesc("outboxkit_log_relay_slot_exists", "1 when the log relay's replication slot exists, 0 when it is missing.", slotLabels, nil)
	slotActiveDesc   = prometheus.NewDesc("outboxkit_log_relay_slot_active", "1 while a relay reads the replication slot.", slotLabels, nil)
	slotLagDesc      = prometheus.NewDesc("outboxkit_log_relay_slot_lag_bytes", "WAL written since the slot's confirmed position, in bytes.", slotLabels, nil)
	slotRetainedDesc = prometheus.NewDesc("outboxkit_log_relay_slot_retained_bytes", "WAL the slot keeps from removal, in bytes.", slotLabels, nil)
	slotSafeDesc     = prometheus.NewDesc("outboxkit_log_relay_slot_safe_wal_bytes",
		"WAL that can still be written before the slot is invalidated (max_slot_wal_keep_size), in bytes.", slotLabels, nil)
	slotParkedDesc = prometheus.NewDesc("outboxkit_log_relay_parked_keys",
		"Partition keys whose oldest event backs off after a failure, holding their later events.", slotLabels, nil)
	slotPausedDesc = prometheus.NewDesc("outboxkit_log_relay_paused",
		"1 while an operator pauses the relay group: it publishes nothing and its slot's lag grows.", slotLabels, nil)
	slotHeldDesc = prometheus.NewDesc("outboxkit_log_relay_held_events",
		"Events read and held by a pause (of the relay, of their topic, or of an earlier event of their key), holding the slot's confirmed position.", slotLabels, nil)
	slotStatusDesc = prometheus.NewDesc("outboxkit_log_relay_slot_wal_status", "1 for the slot's wal_status.",
		[]string{"relay", "slot", "status"}, nil)
)

type slotCollector struct{ sources []SlotSource }

// Describe describes nothing: the collector is unchecked, like NewLagCollector's.
func (c *slotCollector) Describe(chan<- *prometheus.Desc) {}

func (c *slotCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, src := range c.sources {
		s, err := src.SlotStatus(ctx)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(slotExistsDesc, prometheus.GaugeValue, boolValue(s.Exists), s.Relay, s.Slot)
		ch <- prometheus.MustNewConstMetric(slotActiveDesc, prometheus.GaugeValue, boolValue(s.Active), s.Relay, s.Slot)
		ch <- prometheus.MustNewConstMetric(slotParkedDesc, prometheus.GaugeValue, float64(s.ParkedKeys), s.Relay, s.Slot)
		ch <- prometheus.MustNewConstMetric(slotPausedDesc, prometheus.GaugeValue, boolValue(s.Paused), s.Relay, s.Slot)
		ch <- prometheus.MustNewConstMetric(slotHeldDesc, prometheus.GaugeValue, float64(s.HeldEvents), s.Relay, s.Slot)
		if !s.Exists {
			continue
		}
		ch <- prometheus.MustNewConstMetric(slotLagDesc, prometheus.GaugeValue, float64(s.LagBytes), s.Relay, s.Slot)
		ch <- prometheus.MustNewConstMetric(slotRetainedDesc, prometheus.GaugeValue, float64(s.RetainedBytes), s.Relay, s.Slot)
		if s.SafeWALBytes >= 0 {
			ch <- prometheus.MustNewConstMetric(slotSafeDesc, prometheus.GaugeValue, float64(s.SafeWALBytes), s.Relay, s.Slot)
		}
		for _, st := range []string{"reserved", "extended", "unreserved", "lost"} {
			ch <- prometheus.MustNewConstMetric(slotStatusDesc, prometheus.GaugeValue, boolValue(s.WALStatus == st), s.Relay, s.Slot, st)
		}
	}
}
