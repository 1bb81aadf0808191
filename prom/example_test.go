package prom_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// The forwarder's and a consumer's metrics in one registry: each reports to its Metrics, and the
// outbox's backlog and the consumer's waiting dead letters are read from the store at scrape time.
func ExampleNewForwarderMetrics() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, err = forwarder.New(forwarder.Config{Store: st, Publisher: nopPublisher{}, Name: "relay-1",
		Metrics: prom.NewForwarderMetrics(reg)})
	if err != nil {
		log.Fatal(err)
	}
	_, err = middleware.Stack(middleware.StackConfig{Store: st, Consumer: "shipping", Metrics: prom.NewConsumerMetrics(reg)})
	if err != nil {
		log.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if name := f.GetName(); strings.HasSuffix(name, "pending") || strings.HasSuffix(name, "dead_letters_waiting") {
			fmt.Println(name, f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// outboxkit_consumer_dead_letters_waiting 0
	// outboxkit_outbox_pending 0
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// A fleet's view, exported by any process that reaches its coordination database: here one
// member holds one outbox of two. In a member or a sidecar, register it in the registry that
// serves /metrics.
func ExampleNewFleetMetrics() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	coord, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "coordination.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer coord.Close()
	if _, err := pipeline.Migrate(ctx, coord); err != nil {
		log.Fatal(err)
	}
	fc, _ := store.FleetControlOf(coord)
	// What the fleet's members write (fleet.Member does it): a heartbeat, a lease, the catalog.
	_, _ = fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-a"}, time.Minute)
	_, _, _ = fc.AcquireLease(ctx, "shop", "acme", "relay-a", time.Minute)
	_ = fc.RecordFleetOutboxes(ctx, "shop", "relay-a", []store.FleetOutbox{{Name: "acme", Tenant: "acme"}, {Name: "globex", Tenant: "globex"}}, time.Hour)

	metrics, err := prom.NewFleetMetrics(fc, "shop")
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "outboxkit_fleet_members", "outboxkit_fleet_outbox_owned":
			for _, m := range f.GetMetric() {
				labels := []string{}
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				fmt.Println(f.GetName(), labels, m.GetGauge().GetValue())
			}
		}
	}
	// Output:
	// outboxkit_fleet_members [fleet=shop] 1
	// outboxkit_fleet_outbox_owned [fleet=shop outbox=acme owner=relay-a tenant=acme] 1
	// outboxkit_fleet_outbox_owned [fleet=shop outbox=globex owner= tenant=globex] 0
}

// A fleet member's own metrics: its leases, and each outbox's forwarder. Pass it as the member's
// Metrics and its Forwarder method as ForwarderMetrics.
func ExampleNewMemberMetrics() {
	reg := prometheus.NewRegistry()
	metrics, err := prom.NewMemberMetrics(reg)
	if err != nil {
		log.Fatal(err)
	}
	cfg := fleet.Config{
		Metrics:          metrics,
		ForwarderMetrics: metrics.Forwarder, // each outbox's forwarder, labelled by the outbox
		// Coordination, Catalog, Open and Publisher as in fleet.New's example.
	}
	_ = cfg
	metrics.LeaseAcquired("acme", 1) // what a member reports as it acquires an outbox
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "outboxkit_fleet_member_leases_acquired_total" {
			fmt.Println(f.GetName(), f.GetMetric()[0].GetCounter().GetValue())
		}
	}
	// Output:
	// outboxkit_fleet_member_leases_acquired_total 1
}
