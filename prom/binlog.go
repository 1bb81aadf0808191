package prom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/forwarder"
)

// BinlogSource reads a binlog relay group's status: *mysqlbinlog.Relay (package
// forwarder/mysqlbinlog).
type BinlogSource interface {
	Status(ctx context.Context) (forwarder.BinlogStatus, error)
}

// NewBinlogCollector exports, at each scrape, each binlog relay group as its checkpoint and the
// server tell it (schema is the outbox's database, as on the forwarder's series):
//
//	outboxkit_binlog_relay_active{relay, schema}                  1 while a relay of the group holds its lock (reads the binary log)
//	outboxkit_binlog_relay_paused{relay, schema}                  1 while an operator pauses the relay group
//	outboxkit_binlog_relay_lag_bytes{relay, schema}               binary log written since the checkpoint
//	outboxkit_binlog_relay_checkpoint_age_seconds{relay, schema}  since the checkpoint was recorded, by the server's clock
//	outboxkit_binlog_relay_checkpoint_purged{relay, schema}       1 when the checkpoint's binary log file is purged
//
// Every process of the group that exports it — the relay reading and those waiting — reads the
// same figures from the server. Before the group's first checkpoint only _active is exported; the
// lag is absent while the checkpoint is purged, and the lag and the purge while the relay's user
// may not list the binary logs (BINLOG MONITOR, REPLICATION CLIENT on MySQL). A group that cannot
// be read at a scrape has no series in it. The commit→publish time is the forwarder's
// outboxkit_forwarder_commit_to_confirm_seconds (NewForwarderMetrics).
func NewBinlogCollector(sources ...BinlogSource) prometheus.Collector {
	return &binlogCollector{sources: sources}
}

var (
	binlogLabels     = []string{"relay", "schema"}
	binlogActiveDesc = prometheus.NewDesc("outboxkit_binlog_relay_active",
		"1 while a relay of the binlog relay group holds the group's lock: it reads the binary log.", binlogLabels, nil)
	binlogPausedDesc = prometheus.NewDesc("outboxkit_binlog_relay_paused",
		"1 while an operator pauses the binlog relay group: it publishes nothing and its lag grows.", binlogLabels, nil)
	binlogLagDesc = prometheus.NewDesc("outboxkit_binlog_relay_lag_bytes",
		"Binary log written since the binlog relay group's checkpoint, in bytes.", binlogLabels, nil)
	binlogAgeDesc = prometheus.NewDesc("outboxkit_binlog_relay_checkpoint_age_seconds",
		"Time since the binlog relay group's checkpoint was recorded, by the server's clock.", binlogLabels, nil)
	binlogPurgedDesc = prometheus.NewDesc("outboxkit_binlog_relay_checkpoint_purged",
		"1 when the binary log file of the binlog relay group's checkpoint is purged: its next start recovers from the table.", binlogLabels, nil)
)

type binlogCollector struct{ sources []BinlogSource }

// Describe describes nothing: the collector is unchecked, like NewSlotCollector's.
func (c *binlogCollector) Describe(chan<- *prometheus.Desc) {}

func (c *binlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, src := range c.sources {
		s, err := src.Status(ctx)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(binlogActiveDesc, prometheus.GaugeValue, boolValue(s.Active), s.Relay, s.Database)
		if s.CheckpointAt.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(binlogPausedDesc, prometheus.GaugeValue, boolValue(s.Paused), s.Relay, s.Database)
		ch <- prometheus.MustNewConstMetric(binlogAgeDesc, prometheus.GaugeValue, s.CheckpointAge.Seconds(), s.Relay, s.Database)
		if s.LogError != "" {
			continue
		}
		ch <- prometheus.MustNewConstMetric(binlogPurgedDesc, prometheus.GaugeValue, boolValue(s.Purged), s.Relay, s.Database)
		if s.LagBytes >= 0 {
			ch <- prometheus.MustNewConstMetric(binlogLagDesc, prometheus.GaugeValue, float64(s.LagBytes), s.Relay, s.Database)
		}
	}
}
