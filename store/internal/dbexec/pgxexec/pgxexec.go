// Package pgxexec is dbexec over pgx: a pool, its connections and its transactions. Only the pgx
// driver imports it, so that the database/sql drivers compile without pgx.
package pgxexec

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/store/internal/dbexec"
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

func (p pgxQ) Query(ctx context.Context, query string, args ...any) (dbexec.Rows, error) {
	rows, err := p.q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

func (p pgxQ) QueryRow(ctx context.Context, query string, args ...any) dbexec.Row {
	return pgxRow{p.q.QueryRow(ctx, query, args...)}
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error { r.Rows.Close(); return r.Err() }

type pgxRow struct{ pgx.Row }

func (r pgxRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return dbexec.ErrNoRows
	}
	return err
}

func pgxOptions(o dbexec.TxOptions) pgx.TxOptions {
	switch {
	case o.Serializable:
		return pgx.TxOptions{IsoLevel: pgx.Serializable}
	case o.ReadCommitted:
		return pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	}
	return pgx.TxOptions{}
}

// DB is a dbexec.DB over a pgx pool.
func DB(pool *pgxpool.Pool) dbexec.DB { return pgxDB{pgxQ{pool}, pool} }

type pgxDB struct {
	pgxQ
	pool *pgxpool.Pool
}

func (d pgxDB) Begin(ctx context.Context, o dbexec.TxOptions) (dbexec.Tx, error) {
	tx, err := d.pool.BeginTx(ctx, pgxOptions(o))
	if err != nil {
		return nil, err
	}
	return Tx(tx), nil
}

func (d pgxDB) Conn(ctx context.Context) (dbexec.Conn, error) {
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

func (c pgxConn) Begin(ctx context.Context, o dbexec.TxOptions) (dbexec.Tx, error) {
	tx, err := c.c.BeginTx(ctx, pgxOptions(o))
	if err != nil {
		return nil, err
	}
	return Tx(tx), nil
}

func (c pgxConn) Release(discard bool) {
	if discard {
		_ = c.c.Conn().Close(context.Background())
	}
	c.c.Release()
}

// ConnOf returns the pgx connection under a dbexec.Conn from DB, for what only pgx can do (batches,
// LISTEN); nil for another Conn.
func ConnOf(c dbexec.Conn) *pgx.Conn {
	if pc, ok := c.(pgxConn); ok {
		return pc.c.Conn()
	}
	return nil
}

// Tx is a dbexec.Tx over a pgx transaction.
func Tx(tx pgx.Tx) dbexec.Tx { return pgxTx{pgxQ{tx}, tx} }

type pgxTx struct {
	pgxQ
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }
func (t pgxTx) User() any                          { return t.tx }
