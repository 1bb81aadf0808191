package store_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/sqlitestore" // registers sqlite://; import the driver of your database
)

// A store opened by URL — as a service that takes its database from configuration does — then its
// tables created, and the application's own statement written once for every database.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// postgres://user:pass@host:5432/db (import store/pgsqlstore), mysql://user:pass@host:3306/db
	// (store/mysqlstore), or every one of them with store/allstores.
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "shop.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	res, err := pipeline.Migrate(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(db.Info().Name, "migrated:", res.Version > 0)
	fmt.Println(store.Rebind("postgres", `INSERT INTO orders (id, customer) VALUES (?, ?)`))
	// Output:
	// sqlite migrated: true
	// INSERT INTO orders (id, customer) VALUES ($1, $2)
}

// A relay fleet's leases in its coordination database (here SQLite): one member takes an outbox,
// another is refused and told who holds it, and once the first releases it the second takes it
// with the next fencing token.
func ExampleFleetControlOf() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "fleet.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	fc, ok := store.FleetControlOf(db)
	if !ok {
		log.Fatal("this store keeps no fleet")
	}
	const term = 30 * time.Second
	a, ok, _ := fc.AcquireLease(ctx, "relays", "tenant-7", "member-a", term)
	fmt.Println("a:", ok, a.Owner, a.Token)
	b, ok, _ := fc.AcquireLease(ctx, "relays", "tenant-7", "member-b", term)
	fmt.Println("b:", ok, b.Owner, b.Token)
	_ = fc.ReleaseLease(ctx, "relays", "tenant-7", "member-a", a.Token)
	b, ok, _ = fc.AcquireLease(ctx, "relays", "tenant-7", "member-b", term)
	fmt.Println("b:", ok, b.Owner, b.Token)
	renewed, _ := fc.RenewLeases(ctx, "relays", "member-a", []store.Lease{a}, term)
	fmt.Println("a renews:", len(renewed))
	// Output:
	// a: true member-a 1
	// b: false member-a 1
	// b: true member-b 2
	// a renews: 0
}

// A transactional relay's recovery: the broker's record says rows 1 and 2 were committed, and the
// relay that committed them died before it marked them. Marking twice changes nothing.
func ExampleCommitterOf() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "orders.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := db.UnwrapTx(tx).InsertOutbox(ctx, []store.OutboxMessage{
		{UUID: "e-1", Topic: "orders", Payload: []byte(`{}`), Metadata: []byte(`{}`)},
		{UUID: "e-2", Topic: "orders", Payload: []byte(`{}`), Metadata: []byte(`{}`)},
		{UUID: "e-3", Topic: "orders", Payload: []byte(`{}`), Metadata: []byte(`{}`)},
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	com, ok := store.CommitterOf(db)
	if !ok {
		log.Fatal("this store cannot mark committed rows")
	}
	n, _ := com.MarkCommitted(ctx, []int64{1, 2}, time.Now(), false)
	fmt.Println("marked:", n)
	n, _ = com.MarkCommitted(ctx, []int64{1, 2}, time.Now(), false)
	fmt.Println("again:", n)
	st, _ := db.OutboxStats(ctx, time.Now())
	fmt.Println("pending:", st.Pending)
	// Output:
	// marked: 2
	// again: 0
	// pending: 1
}
