package outboxkit

import (
	"context"
	"fmt"
)

type txKey struct{}

// WithTx returns ctx carrying tx: the transaction outboxkit began for the work done under ctx — a
// consumer's inbox transaction, an HTTP request's idempotency record — as the application's
// database library sees it (pgx.Tx, *sql.Tx).
func WithTx(ctx context.Context, tx any) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// TxFrom returns the transaction outboxkit began for the work under ctx, as a TTx: the handler or
// HTTP handler makes its writes in it, and they commit together with outboxkit's own record. ok is
// false when there is none; err says so when there is one of another type (the store's driver
// works with another library's transactions than TTx).
func TxFrom[TTx any](ctx context.Context) (tx TTx, ok bool, err error) {
	raw := ctx.Value(txKey{})
	if raw == nil {
		return tx, false, nil
	}
	tx, ok = raw.(TTx)
	if !ok {
		return tx, false, fmt.Errorf("the transaction is a %T, not a %T: use the store driver of your database library "+
			"(store/pgxstore for pgx.Tx, store/pgsqlstore, mysqlstore or sqlitestore for *sql.Tx)", raw, tx)
	}
	return tx, true, nil
}
