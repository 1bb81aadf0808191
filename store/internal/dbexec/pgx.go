package dbexec

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgxQuerier is what pgx's pool, connections and transactions have in common.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type pgxQ struct{ q pgxQuerier }

func (p pgxQ) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.q.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (p pgxQ) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := p.q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

func (p pgxQ) QueryRow(ctx context.Context, query string, args ...any) Row {
	return pgxRow{p.q.QueryRow(ctx, query, args...)}
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error { r.Rows.Close(); return r.Rows.Err() }

type pgxRow struct{ pgx.Row }

func (r pgxRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNoRows
	}
	return err
}

func pgxOptions(o TxOptions) pgx.TxOptions {
	switch {
	case o.Serializable:
		return pgx.TxOptions{IsoLevel: pgx.Serializable}
	case o.ReadCommitted:
		return pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	}
	return pgx.TxOptions{}
}

// Pgx is a DB over a pgx pool.
func Pgx(pool *pgxpool.Pool) DB { return pgxDB{pgxQ{pool}, pool} }

type pgxDB struct {
	pgxQ
	pool *pgxpool.Pool
}

func (d pgxDB) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := d.pool.BeginTx(ctx, pgxOptions(o))
	if err != nil {
		return nil, err
	}
	return PgxTx(tx), nil
}

func (d pgxDB) Conn(ctx context.Context) (Conn, error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pgxConn{pgxQ{c}, c}, nil
}

type pgxConn struct {
	pgxQ
	c *pgxpool.Conn
}

func (c pgxConn) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := c.c.BeginTx(ctx, pgxOptions(o))
	if err != nil {
		return nil, err
	}
	return PgxTx(tx), nil
}

func (c pgxConn) Release(discard bool) {
	if discard {
		_ = c.c.Conn().Close(context.Background())
	}
	c.c.Release()
}

// PgxConnOf returns the pgx connection under a Conn from Pgx, for what only pgx can do (batches,
// LISTEN); nil for another Conn.
func PgxConnOf(c Conn) *pgx.Conn {
	if pc, ok := c.(pgxConn); ok {
		return pc.c.Conn()
	}
	return nil
}

// PgxTx is a Tx over a pgx transaction.
func PgxTx(tx pgx.Tx) Tx { return pgxTx{pgxQ{tx}, tx} }

type pgxTx struct {
	pgxQ
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }
func (t pgxTx) User() any                          { return t.tx }
