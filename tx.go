package outboxkit

import (
	"context"
	"fmt"
	"reflect"
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
		return tx, false, &TxTypeError{Want: reflect.TypeFor[TTx](), Got: reflect.TypeOf(raw)}
	}
	return tx, true, nil
}

// TxTypeError says that a handler wants its transaction in another type than the store gives: a
// handler written for pgx.Tx behind a database/sql store, say. It is a mistake in the program, not
// in the message: the middleware stack holds every message (none is dead-lettered, none counts a
// delivery) and logs it until the program is fixed.
type TxTypeError struct {
	Want, Got reflect.Type
}

func (e *TxTypeError) Error() string {
	return fmt.Sprintf("the handler takes its transaction as a %v, but the store gives a %v: write the handler for %v, "+
		"or use the store driver of the handler's database library (store/pgxstore for pgx.Tx; store/pgsqlstore, "+
		"mysqlstore or sqlitestore for *sql.Tx)", e.Want, e.Got, e.Got)
}
