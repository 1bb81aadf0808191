// Package stores is the former home of store.Open.
//
// Deprecated: use store.Open, with the driver of your database imported (store/pgsqlstore,
// store/mysqlstore, store/sqlitestore) or every driver (store/allstores). This package imports every
// driver, so a program that uses it compiles every database client; it will be removed.
package stores

import (
	"context"

	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every driver, as this package always opened
)

// DB is store.DB.
//
// Deprecated: use store.DB.
type DB = store.DB

// Options is store.OpenOptions.
//
// Deprecated: use store.OpenOptions (Namespace is now Schema).
type Options struct {
	Namespace     string
	DisableNotify bool
	PollOnly      bool
	MaxConns      int
}

// DefaultMaxConns is store.DefaultMaxConns.
//
// Deprecated: use store.DefaultMaxConns.
const DefaultMaxConns = store.DefaultMaxConns

// Open is store.Open.
//
// Deprecated: use store.Open.
func Open(ctx context.Context, rawURL string, opts Options) (*DB, error) {
	return store.Open(ctx, rawURL, store.OpenOptions{Schema: opts.Namespace, DisableNotify: opts.DisableNotify,
		PollOnly: opts.PollOnly, MaxConns: opts.MaxConns})
}

// Rebind is store.Rebind.
//
// Deprecated: use store.Rebind.
func Rebind(dialect, query string) string { return store.Rebind(dialect, query) }
