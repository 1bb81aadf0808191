package pglog_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/amqpbackend"  // the broker's package
	_ "github.com/outboxkit/outboxkit/backends/kafkabackend" // the other example's
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// The log relay in a service: the forwarder says where and how to publish, the relay reads the
// outbox's INSERTs from a replication slot instead of claiming rows. Writers do not change. Run a
// second process the same way as a standby: it takes over the slot when the first one dies.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// The server runs wal_level = logical; the role has REPLICATION; no pooler in between.
	st, err := pgxstore.Open(ctx, os.Getenv("DATABASE_URL"), pgxstore.Config{PollOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Pool().Close()
	broker, err := backends.Open(ctx, os.Getenv("BROKER_URL"), backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker.Publisher, Name: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := pglog.New(pglog.Config{Forwarder: f, Pool: st.Pool()})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends: SIGINT here
		log.Fatal(err)
	}
}

// The log relay into Kafka exactly once, for consumers that read only committed records: a
// transactional_id in the broker's URL makes the forwarder's publisher transactional, and the
// relay commits a Kafka transaction at each checkpoint. FlushInterval is then the most an event
// waits, once published, to become visible: shorter means fresher events and more transactions a
// second. Each relay group (the forwarder's Name) needs a transactional id of its own; a relay
// whose group another one took over is fenced, and Run returns that error.
func ExampleNew_exactlyOnceIntoKafka() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	st, err := pgxstore.Open(ctx, os.Getenv("DATABASE_URL"), pgxstore.Config{PollOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Pool().Close()
	broker, err := backends.Open(ctx, "kafka://kafka:9092?transactional_id=orders-log-relay", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker.Publisher, Name: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := pglog.New(pglog.Config{Forwarder: f, Pool: st.Pool(), FlushInterval: 200 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); outboxkit.IsFenced(err) {
		log.Fatalf("another relay took the group over: %v", err) // exit; a supervisor restarts this one as a standby
	} else if err != nil {
		log.Fatal(err)
	}
}

// An operator's view of the log relays of an outbox, without running one: each relay group's
// slot, whether a relay reads it, and how far behind it is (outboxctl status prints the same).
func ExampleReadSlots() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	slots, err := pglog.ReadSlots(ctx, pool, "outboxkit")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range slots {
		fmt.Printf("%s: slot %s, exists %v, read %v, wal_status %s, %d bytes behind\n",
			s.Relay, s.Slot, s.Exists, s.Active, s.WALStatus, s.LagBytes)
	}
}

// The relay's slot in Prometheus: the relay is a prom.SlotSource, read at each scrape.
func ExampleRelay_SlotStatus() {
	var relay *pglog.Relay // built with pglog.New, as in the example of New
	prometheus.MustRegister(prom.NewSlotCollector(relay))
}
