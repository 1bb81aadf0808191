package prom_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
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
