package integration

import (
	"context"
	"os"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

type slotSource struct{ s forwarder.SlotStatus }

func (s slotSource) SlotStatus(context.Context) (forwarder.SlotStatus, error) { return s.s, nil }

type binlogSource struct{ s forwarder.BinlogStatus }

func (s binlogSource) Status(context.Context) (forwarder.BinlogStatus, error) { return s.s, nil }

// Every metric the shipped alerts read must be one outboxkit exports, or a rename would silently
// disarm an alert. promtool (make alerts) checks the rules' syntax and that they fire.
func TestAlertsReadMetricsThatExist(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	reg := prometheus.NewRegistry()
	writeEvents(t, pgDB(pg), "orders", []string{"k"}, 1)
	relay := newRelay(t, pgDB(pg), nopPublisher{}, func(c *forwarder.Config) { c.Metrics = prom.NewForwarderMetrics(reg) })
	if _, err := relay.DispatchBatch(context.Background()); err != nil {
		t.Fatal(err)
	}
	stack, err := middleware.Stack(middleware.StackConfig{Store: pg.Store, Consumer: "billing", Metrics: prom.NewConsumerMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	var h message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return nil, handlers.Permanent(os.ErrInvalid) // dead-lettered: every outcome series exists once any does
	}
	for i := len(stack) - 1; i >= 0; i-- {
		h = stack[i](h)
	}
	if _, err := h(message.NewMessage("m-1", []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	// The broker's backlog of a group, as the consumers' side registers it.
	url := testenv.AMQPURL(t)
	b := openBackend(t, url, backends.Options{})
	topic := testenv.UniqueName(t, "alerts")
	dropWhenDone(t, "amqp", url, []string{topic}, []string{"billing"})
	sub, err := b.NewSubscriber("billing")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(prom.NewLagCollector(b, topic, "billing"))
	// The log relay's slot, as a relay reports it (forwarder/pglog's tests read a real one).
	reg.MustRegister(prom.NewSlotCollector(slotSource{forwarder.SlotStatus{Relay: "default", Slot: "outboxkit_default",
		Mode: "table", Exists: true, Active: true, WALStatus: "reserved", SafeWALBytes: -1}}))
	// A binlog relay group, as a relay reports it (forwarder/mysqlbinlog's tests read a real one).
	reg.MustRegister(prom.NewBinlogCollector(binlogSource{forwarder.BinlogStatus{Relay: "default", Database: "outboxkit",
		Progress: "gtid", Active: true, CheckpointAt: time.Now(), LagBytes: 0}}))
	// A fleet's view, read from its coordination database (here the same Postgres schema).
	fc, ok := store.FleetControlOf(pg.Store)
	if !ok {
		t.Fatal("the Postgres store keeps no fleet")
	}
	fleetName := testenv.UniqueName(t, "fleet")
	if _, err := fc.FleetHeartbeat(context.Background(), fleetName, store.FleetMember{Name: "relay-a"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := fc.RecordFleetOutboxes(context.Background(), fleetName, "relay-a", []store.FleetOutbox{{Name: "orders"}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	fleetMetrics, err := prom.NewFleetMetrics(fc, fleetName)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(fleetMetrics)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}

	rules, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`outboxkit_[a-z_]+`).FindAllString(string(rules), -1) {
		used[m] = true
	}
	if len(used) < 5 {
		t.Fatalf("found only %v in the alerts", used)
	}
	var missing []string
	for name := range used {
		if !exported[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the alerts read metrics nothing exports: %v", missing)
	}
}
