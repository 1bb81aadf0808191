package store_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

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
