package handlers

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// WithTx returns ctx carrying tx, as the inbox middleware hands it to the handler.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns the transaction the handler must make its effect in. ok is false when the
// handler runs without the inbox middleware in front of it.
func TxFrom(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}
