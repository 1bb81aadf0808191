package dbexec

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

type stdQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type stdQ struct{ q stdQuerier }

func (s stdQ) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s stdQ) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	return s.q.QueryContext(ctx, query, args...)
}

func (s stdQ) QueryRow(ctx context.Context, query string, args ...any) Row {
	return s.q.QueryRowContext(ctx, query, args...)
}

func stdOptions(o TxOptions) *sql.TxOptions {
	switch {
	case o.Serializable:
		return &sql.TxOptions{Isolation: sql.LevelSerializable}
	case o.ReadCommitted:
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// Std is a DB over a database/sql pool.
func Std(db *sql.DB) DB { return stdDB{stdQ{db}, db} }

type stdDB struct {
	stdQ
	db *sql.DB
}

func (d stdDB) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := d.db.BeginTx(ctx, stdOptions(o))
	if err != nil {
		return nil, err
	}
	return StdTx(tx), nil
}

func (d stdDB) Conn(ctx context.Context) (Conn, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return stdConn{stdQ{c}, c}, nil
}

type stdConn struct {
	stdQ
	c *sql.Conn
}

func (c stdConn) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := c.c.BeginTx(ctx, stdOptions(o))
	if err != nil {
		return nil, err
	}
	return StdTx(tx), nil
}

func (c stdConn) Release(discard bool) {
	if discard {
		// Returning driver.ErrBadConn from Raw makes database/sql close the connection rather
		// than pool it.
		_ = c.c.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = c.c.Close()
}

// StdConnOf returns the *sql.Conn under a Conn from Std; nil for another Conn.
func StdConnOf(c Conn) *sql.Conn {
	if sc, ok := c.(stdConn); ok {
		return sc.c
	}
	return nil
}

// StdTx is a Tx over a database/sql transaction.
func StdTx(tx *sql.Tx) Tx { return stdTx{stdQ{tx}, tx} }

type stdTx struct {
	stdQ
	tx *sql.Tx
}

func (t stdTx) Commit(context.Context) error { return t.tx.Commit() }
func (t stdTx) Rollback(context.Context) error {
	if err := t.tx.Rollback(); err != nil && err != sql.ErrTxDone {
		return err
	}
	return nil
}
func (t stdTx) User() any { return t.tx }
