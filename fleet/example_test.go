package fleet_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// A member of a relay fleet: it relays the outboxes of two tenants, each in a database of its
// own, to one broker, and stamps each message with the tenant, the outbox and the lease's token.
// Run the same program on more machines and they share the outboxes. Here every database is a
// SQLite file; in production the coordination database and the tenants' are Postgres or MySQL
// (a schema per tenant), and the broker is one of package backends.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "fleet-example")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ctx := context.Background()

	// The coordination database holds the fleet's members and leases.
	coord, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "coordination.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = coord.Close() }()
	if _, err := pipeline.Migrate(ctx, coord); err != nil {
		log.Fatal(err)
	}

	// Two tenants, each with an event waiting in its outbox.
	var catalog fleet.Outboxes
	for _, tenant := range []string{"acme", "globex"} {
		url := "sqlite://" + filepath.Join(dir, tenant+".db")
		if err := writeAnOrder(ctx, url); err != nil {
			log.Fatal(err)
		}
		catalog = append(catalog, fleet.Outbox{Name: tenant, URL: url})
	}

	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer func() { _ = broker.Close() }()
	orders, err := broker.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}

	m, err := fleet.New(fleet.Config{
		Fleet:        "relays",
		Coordination: coord,
		Catalog:      catalog, // or fleet.TableCatalog(db, query), read at every tick
		Open:         fleetstores.Opener(),
		Publisher:    broker,
		Tick:         100 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }() // until SIGTERM, in a service

	var got []string
	for range 2 {
		msg := <-orders
		msg.Ack()
		got = append(got, fmt.Sprintf("%s: outbox %s, token %s", outboxkit.Tenant(msg),
			msg.Metadata.Get(outboxkit.MetadataOutbox), msg.Metadata.Get(outboxkit.MetadataLeaseToken)))
	}
	slices.Sort(got)
	for _, line := range got {
		fmt.Println(line)
	}
	fmt.Println("relayed by this member:", m.Owned())

	stop() // the member stops its relays and leaves the fleet
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// acme: outbox acme, token 1
	// globex: outbox globex, token 1
	// relayed by this member: [acme globex]
}

// writeAnOrder migrates the outbox at url and writes an event into it, as the tenant's service does.
func writeAnOrder(ctx context.Context, url string) error {
	db, err := store.Open(ctx, url, store.OpenOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		return err
	}
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	pub, err := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
	if err != nil {
		return err
	}
	if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", "order-1", []byte(`{"total":42}`))); err != nil {
		return err
	}
	return tx.Commit()
}

// The catalog from the application's own table of tenants, read at every tick: a tenant added to
// the table is relayed within a tick or two, one whose row says enabled = false stops.
func ExampleTableCatalog() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-example")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	app, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "app.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = app.Close() }()
	if _, err := app.SQL.ExecContext(ctx, `CREATE TABLE tenants (id TEXT PRIMARY KEY, db_url TEXT, db_schema TEXT, active BOOLEAN);
		INSERT INTO tenants VALUES ('tenant-1', 'postgres://relay@db-1/shop', 'tenant_1', TRUE),
			('tenant-2', 'postgres://relay@db-1/shop', 'tenant_2', FALSE)`); err != nil {
		log.Fatal(err)
	}

	catalog := fleet.TableCatalog(app.SQL, `SELECT id AS name, db_url AS url, db_schema AS schema, active AS enabled FROM tenants`)
	outboxes, err := catalog.Outboxes(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range outboxes {
		fmt.Printf("%s: %s schema %s, disabled %t\n", o.Name, o.URL, o.Schema, o.Disabled)
	}
	// Output:
	// tenant-1: postgres://relay@db-1/shop schema tenant_1, disabled false
	// tenant-2: postgres://relay@db-1/shop schema tenant_2, disabled true
}

// What the coordination database says of a fleet, from any process that reaches it (outboxctl,
// a dashboard): who is in it, who owns what, and which outboxes nobody relays.
func ExampleReadStatus() {
	ctx := context.Background()
	coord, err := store.Open(ctx, os.Getenv("COORDINATION_URL"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = coord.Close() }()
	fc, ok := store.FleetControlOf(coord)
	if !ok {
		log.Fatal(store.ErrNoFleetControl)
	}
	st, err := fleet.ReadStatus(ctx, fc, "relays")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d live members\n", st.LiveMembers())
	for _, o := range st.Outboxes {
		switch {
		case o.Unowned():
			fmt.Printf("%s: nobody relays it, for %s\n", o.Name, o.UnownedFor)
		case o.Error != "":
			fmt.Printf("%s: %s\n", o.Name, o.Error)
		default:
			fmt.Printf("%s: %s (token %d), %d pending\n", o.Name, o.Owner, o.Token, o.Pending)
		}
	}
}
