package pglog_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/amqpbackend" // the broker's package
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
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
