package mysqlbinlog_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/amqpbackend" // the broker's package
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// The binlog relay in a service: the forwarder says where and how to publish, the relay reads the
// outbox's rows from the binary log instead of claiming them. Writers do not change. A second
// process run the same way waits while the first reads, and reads on from its checkpoint once the
// first one stops.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// The server writes the binary log in ROW format with FULL images; the URL's user has
	// REPLICATION SLAVE and BINLOG MONITOR (REPLICATION CLIENT on MySQL).
	// outboxkit's tables are in their own database ("outboxkit"), on the same server.
	dbURL := os.Getenv("DATABASE_URL") // mysql://relay:secret@db:3306/shop
	db, err := mysqlstore.Open(ctx, dbURL, store.OpenOptions{Schema: "outboxkit"})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	broker, err := backends.Open(ctx, os.Getenv("BROKER_URL"), backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	f, err := forwarder.New(forwarder.Config{Store: db, Publisher: broker.Publisher, Name: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := mysqlbinlog.New(mysqlbinlog.Config{Forwarder: f, URL: dbURL})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends: SIGINT here
		log.Fatal(err)
	}
}
