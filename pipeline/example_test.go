package pipeline_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// An order and its OrderPlaced event in one database/sql transaction: both commit, or neither.
// The same code runs on Postgres (store/pgsqlstore) and MySQL (store/mysqlstore).
func ExampleNewPublisher() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	db := st.DB()
	defer db.Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	place := func(id, customer string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer) VALUES (?, ?)`, id, customer); err != nil {
			return err // the aggregate first: its INSERT is its lock
		}
		pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		msg, err := pipeline.NewJSONEvent("OrderPlaced", id, map[string]string{"id": id, "customer": customer})
		if err != nil {
			return err
		}
		if err := pub.Publish("orders", msg); err != nil {
			return err
		}
		return tx.Commit()
	}
	fmt.Println(place("o-1", "ada"))
	fmt.Println(place("o-1", "bob") != nil) // the order exists: its event is not written either

	var events int
	_ = db.QueryRow(`SELECT count(*) FROM outbox_messages WHERE partition_key = 'o-1'`).Scan(&events)
	fmt.Println("events for o-1:", events)
	// Output:
	// <nil>
	// true
	// events for o-1: 1
}

// The same with pgx: pgxstore's publisher takes a pgx.Tx.
func ExampleNewPublisher_pgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := pgxstore.New(pool, pgxstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, "o-1", "ada"); err != nil {
			return err
		}
		pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		msg, err := pipeline.NewJSONEvent("OrderPlaced", "o-1", map[string]string{"id": "o-1", "customer": "ada"})
		if err != nil {
			return err
		}
		return pub.Publish("orders", msg) // pgx.BeginFunc commits when this returns nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
