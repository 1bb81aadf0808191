package pgxstore_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// An order and its OrderPlaced event, committed together; the event's row travels with the COMMIT.
func ExampleStore_Transact() {
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
	orderID, customer := "o-1042", "c-7"
	err = st.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, orderID, customer); err != nil {
			return err // rolls back
		}
		msg, err := pipeline.NewJSONEvent("OrderPlaced", orderID, map[string]string{"id": orderID, "customer": customer})
		if err != nil {
			return err
		}
		return pub.Publish("orders", msg) // checked now, written with the COMMIT
	})
	if err != nil {
		log.Fatal(err) // nothing committed: neither the order nor its event
	}
}

// WAL mode: the event goes to the write-ahead log in the writer's transaction, as a logical
// decoding message sent with the COMMIT, and no outbox row is written; the log relay
// (forwarder/pglog with Mode pglog.ModeWAL) reads it. Until that relay has made its replication
// slot, writers get ErrNoWALRelay.
func ExampleStore_Transact_wal() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/shop") // wal_level = logical, Postgres 14+
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := pgxstore.New(pool, pgxstore.Config{WAL: true})
	if err != nil {
		log.Fatal(err)
	}
	err = st.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "o-1"); err != nil {
			return err
		}
		msg, err := pipeline.NewJSONEvent("OrderPaid", "o-1", map[string]string{"id": "o-1"})
		if err != nil {
			return err
		}
		return pub.Publish("orders", msg)
	})
	if errors.Is(err, pgxstore.ErrNoWALRelay) {
		log.Fatal("start the log relay once before the writers: ", err)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// One LISTEN connection for the relays of many schemas of one database: each schema's store is
// given the same Listener, and a commit in a schema wakes that schema's relay.
func ExampleNewListener() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Named, so that pg_stat_activity shows it: one session, however many schemas.
	l, err := pgxstore.NewListener("postgres://app@db/shop?application_name=relays-listen", pgxstore.ListenerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close() // after the relays have stopped
	for _, schema := range []string{"tenant_1", "tenant_2", "tenant_3"} {
		st, err := pgxstore.New(pool, pgxstore.Config{Schema: schema, Listener: l})
		if err != nil {
			log.Fatal(err)
		}
		_ = st // a forwarder.Forwarder on st listens through l
	}
}
