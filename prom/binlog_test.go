package prom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/prom"
)

type binlogSource struct {
	s   forwarder.BinlogStatus
	err error
}

func (f binlogSource) Status(context.Context) (forwarder.BinlogStatus, error) { return f.s, f.err }

// A binlog relay group is exported as its checkpoint and the server tell it; before its first
// checkpoint only whether a relay holds its lock; what is unknown (a purged checkpoint's lag, the
// binary logs a user may not list) is absent; a group that cannot be read has no series.
func TestBinlogCollector(t *testing.T) {
	at := time.Date(2026, 5, 1, 3, 0, 0, 0, time.UTC)
	c := prom.NewBinlogCollector(
		binlogSource{s: forwarder.BinlogStatus{Relay: "orders", Database: "shop", Progress: "gtid", CheckpointAt: at,
			CheckpointAge: 1500 * time.Millisecond, Active: true, LagBytes: 4096}},
		binlogSource{s: forwarder.BinlogStatus{Relay: "billing", Database: "shop", Progress: "file", CheckpointAt: at,
			CheckpointAge: time.Hour, Paused: true, LagBytes: -1, Purged: true}},
		binlogSource{s: forwarder.BinlogStatus{Relay: "audit", Database: "shop", CheckpointAt: at, CheckpointAge: time.Minute,
			Active: true, LagBytes: -1, LogError: "user 'tool'@'%' may not list the binary logs"}},
		binlogSource{s: forwarder.BinlogStatus{Relay: "new", Database: "shop", LagBytes: -1}},
		binlogSource{err: errors.New("down")},
	)
	want := `
# HELP outboxkit_binlog_relay_active 1 while a relay of the binlog relay group holds the group's lock: it reads the binary log.
# TYPE outboxkit_binlog_relay_active gauge
outboxkit_binlog_relay_active{relay="audit",schema="shop"} 1
outboxkit_binlog_relay_active{relay="billing",schema="shop"} 0
outboxkit_binlog_relay_active{relay="new",schema="shop"} 0
outboxkit_binlog_relay_active{relay="orders",schema="shop"} 1
# HELP outboxkit_binlog_relay_checkpoint_age_seconds Time since the binlog relay group's checkpoint was recorded, by the server's clock.
# TYPE outboxkit_binlog_relay_checkpoint_age_seconds gauge
outboxkit_binlog_relay_checkpoint_age_seconds{relay="audit",schema="shop"} 60
outboxkit_binlog_relay_checkpoint_age_seconds{relay="billing",schema="shop"} 3600
outboxkit_binlog_relay_checkpoint_age_seconds{relay="orders",schema="shop"} 1.5
# HELP outboxkit_binlog_relay_checkpoint_purged 1 when the binary log file of the binlog relay group's checkpoint is purged: its next start recovers from the table.
# TYPE outboxkit_binlog_relay_checkpoint_purged gauge
outboxkit_binlog_relay_checkpoint_purged{relay="billing",schema="shop"} 1
outboxkit_binlog_relay_checkpoint_purged{relay="orders",schema="shop"} 0
# HELP outboxkit_binlog_relay_lag_bytes Binary log written since the binlog relay group's checkpoint, in bytes.
# TYPE outboxkit_binlog_relay_lag_bytes gauge
outboxkit_binlog_relay_lag_bytes{relay="orders",schema="shop"} 4096
# HELP outboxkit_binlog_relay_paused 1 while an operator pauses the binlog relay group: it publishes nothing and its lag grows.
# TYPE outboxkit_binlog_relay_paused gauge
outboxkit_binlog_relay_paused{relay="audit",schema="shop"} 0
outboxkit_binlog_relay_paused{relay="billing",schema="shop"} 1
outboxkit_binlog_relay_paused{relay="orders",schema="shop"} 0
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// The binlog relay's group beside the forwarder's metrics: *mysqlbinlog.Relay is a BinlogSource.
func ExampleNewBinlogCollector() {
	reg := prometheus.NewRegistry()
	// In a service: prom.NewBinlogCollector(relay), relay a *mysqlbinlog.Relay.
	reg.MustRegister(prom.NewBinlogCollector(binlogSource{s: forwarder.BinlogStatus{Relay: "orders", Database: "shop",
		Progress: "gtid", Position: "1-1-42", CheckpointAt: time.Now(), Active: true, LagBytes: 512}}))
	families, _ := reg.Gather()
	for _, f := range families {
		fmt.Println(f.GetName(), len(f.GetMetric()))
	}
	// Output:
	// outboxkit_binlog_relay_active 1
	// outboxkit_binlog_relay_checkpoint_age_seconds 1
	// outboxkit_binlog_relay_checkpoint_purged 1
	// outboxkit_binlog_relay_lag_bytes 1
	// outboxkit_binlog_relay_paused 1
}
