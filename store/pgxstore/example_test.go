package pgxstore_test

import (
	"context"
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
