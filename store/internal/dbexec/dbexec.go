// Package dbexec gives the store's SQL one way to reach a database, whichever library holds the
// connection: pgx (a pool, a connection, a transaction) or database/sql.
package dbexec

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Querier runs statements.
type Querier interface {
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// DB is a pool of connections.
type DB interface {
	Querier
	Begin(ctx context.Context, opts TxOptions) (Tx, error)
	// Conn takes a connection of its own from the pool, for session state (a lock).
	Conn(ctx context.Context) (Conn, error)
}

// Conn is one connection, held until Release.
type Conn interface {
	Querier
	Begin(ctx context.Context, opts TxOptions) (Tx, error)
	// Release gives the connection back to the pool; with discard, it is closed instead (its
	// session state is uncertain).
	Release(discard bool)
}

// Tx is a transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	// Rollback is safe after Commit.
	Rollback(ctx context.Context) error
	// User is the transaction as its library sees it: pgx.Tx or *sql.Tx.
	User() any
}

// TxOptions are a transaction's options.
type TxOptions struct {
	// Serializable asks for the serializable isolation level; otherwise the database's default.
	Serializable bool
	// ReadCommitted asks for read committed (MySQL's default is repeatable read, whose gap locks
	// on a locking read would block inserts behind it).
	ReadCommitted bool
}

// Rows are a query's result rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Close() error
	Err() error
}

// Row is a single-row result.
type Row interface {
	Scan(dest ...any) error
}

// ErrNoRows is returned by Row.Scan when the query returned no row, whichever library ran it.
var ErrNoRows = sql.ErrNoRows

// Time scans a timestamp whatever form the driver gives it in: time.Time, or text in one of the
// layouts the stores write (SQLite keeps fixed-width UTC text; MySQL without parseTime gives
// bytes). A NULL leaves it zero.
type Time struct{ time.Time }

// TimeLayouts are the textual forms Time reads, in the order tried.
var TimeLayouts = []string{
	"2006-01-02T15:04:05.000000Z",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05",
}

// Scan implements sql.Scanner.
func (t *Time) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		t.Time = time.Time{}
		return nil
	case time.Time:
		t.Time = v
		return nil
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	}
	return fmt.Errorf("cannot read %T as a timestamp", src)
}

func (t *Time) parse(s string) error {
	for _, layout := range TimeLayouts {
		if parsed, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			t.Time = parsed
			return nil
		}
	}
	return fmt.Errorf("cannot read %q as a timestamp", s)
}

// FirstOf runs a query that returns at most one row and scans it into dest; found is false when
// it returned none.
func FirstOf(ctx context.Context, q Querier, query string, args []any, dest ...any) (found bool, err error) {
	err = q.QueryRow(ctx, query, args...).Scan(dest...)
	if errors.Is(err, ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
