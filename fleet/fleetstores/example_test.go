package fleetstores_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/amqpbackend" // the broker's package
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// A relay process of a fleet serving two hundred tenants, each a schema of one Postgres database
// listed in the application's tenants table: the member's share of them shares one pool of ten
// connections and one LISTEN connection, and one broker connection publishes for all. Start as
// many such processes as the load needs; they share the tenants.
func ExampleOpener() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	coord, err := store.Open(ctx, os.Getenv("COORDINATION_URL"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = coord.Close() }()
	if _, err := pipeline.Migrate(ctx, coord); err != nil { // the fleet's tables
		log.Fatal(err)
	}
	broker, err := backends.Open(ctx, os.Getenv("BROKER_URL"), backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = broker.Close() }()

	m, err := fleet.New(fleet.Config{
		Fleet:        "orders-relays",
		Coordination: coord,
		Catalog:      fleet.TableCatalog(coord.SQL, `SELECT tenant_id AS name, db_url AS url, db_schema AS schema FROM tenants`),
		Open:         fleetstores.Opener(fleetstores.MaxConns(10)),
		Publisher:    broker.Publisher,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Run(ctx); err != nil { // until SIGTERM: then it hands its tenants to the others
		log.Fatal(err)
	}
}
