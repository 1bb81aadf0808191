package pgxexec

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// BeginWith takes a connection of pool and begins a transaction on it in the same round trip as
// its first statement, query: BEGIN and query go in one pipeline, ended by one Sync, and read
// reads query's rows. The transaction then holds the connection until Commit or Rollback, which
// give it back to the pool, as pgxpool's own transactions do.
//
// Why not pool.Begin and then the statement: that is two round trips, and pgx makes its
// transactions (the pgx.Tx its Begin returns) only by sending BEGIN alone. pgx.Tx is an interface
// (pgx says so to allow pools and wrappers like this one), so the transaction here is one of ours
// over the connection, with pgx's semantics: statements go to the connection while it is open,
// Begin makes a savepoint, Commit and Rollback end it once and return pgx.ErrTxClosed after, and a
// COMMIT or ROLLBACK that fails closes the connection, which the pool then drops.
//
// The pipeline is safe because BEGIN comes first in it: Postgres keeps an explicit transaction
// open past the Sync, and when query fails the transaction is aborted, not committed in part
// (nothing before it but BEGIN). On any failure the transaction is rolled back, or the connection
// closed when that fails too, before the connection goes back to the pool: it is never handed out
// inside a transaction (pgxpool would drop such a connection in any case).
func BeginWith(ctx context.Context, pool *pgxpool.Pool, query string, args []any, read func(dbexec.Rows) error) (dbexec.Tx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(query, args...)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = read(pgxRows{rows})
			rows.Close()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && conn.Conn().PgConn().TxStatus() != 'T' {
		err = fmt.Errorf("the session is not in an open transaction after BEGIN (status %q)", conn.Conn().PgConn().TxStatus())
	}
	if err != nil {
		abandon(ctx, conn)
		return nil, err
	}
	return Tx(&begunTx{statements: statements{conn: conn.Conn()}, pc: conn}), nil
}

// abandon rolls back whatever transaction the session is in and gives the connection back, or
// closes it when the rollback fails.
func abandon(ctx context.Context, conn *pgxpool.Conn) {
	if c := conn.Conn(); !c.IsClosed() && c.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, err := c.Exec(rctx, "rollback"); err != nil {
			_ = c.Close(rctx)
		}
		cancel()
	}
	conn.Release()
}

// statements forwards a transaction's statements to its session while the transaction, and the
// one it is a savepoint of, are open; once one of them has ended it refuses them with pgx.ErrTxClosed,
// as pgx's transactions do.
type statements struct {
	conn   *pgx.Conn
	outer  *statements // the transaction this one is a savepoint of; nil for the outermost
	closed bool
}

func (s *statements) ended() bool { return s.closed || (s.outer != nil && s.outer.ended()) }

func (s *statements) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.ended() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.conn.Exec(ctx, sql, args...)
}

func (s *statements) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.ended() {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return s.conn.Query(ctx, sql, args...)
}

func (s *statements) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.ended() {
		return errRows{pgx.ErrTxClosed}
	}
	return s.conn.QueryRow(ctx, sql, args...)
}

func (s *statements) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if s.ended() {
		return 0, pgx.ErrTxClosed
	}
	return s.conn.CopyFrom(ctx, table, columns, src)
}

func (s *statements) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if s.ended() {
		return errBatch{pgx.ErrTxClosed}
	}
	return s.conn.SendBatch(ctx, b)
}

func (s *statements) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if s.ended() {
		return nil, pgx.ErrTxClosed
	}
	return s.conn.Prepare(ctx, name, sql)
}

func (s *statements) Conn() *pgx.Conn { return s.conn }

// begunTx is a transaction begun by BeginWith, on a pooled connection it releases when it ends.
type begunTx struct {
	statements
	pc         *pgxpool.Conn // nil once given back
	savepoints int64
	lo         pgx.Tx // the handle LargeObjects needs, made on first use
}

var _ pgx.Tx = (*begunTx)(nil)

func (t *begunTx) release() {
	if t.pc != nil {
		t.pc.Release()
		t.pc = nil
	}
}

func (t *begunTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	if _, err := t.conn.Exec(ctx, "savepoint sp_"+strconv.FormatInt(t.savepoints, 10)); err != nil {
		return nil, err
	}
	return &savepointTx{statements: statements{conn: t.conn, outer: &t.statements}, tx: t, n: t.savepoints}, nil
}

func (t *begunTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	defer t.release()
	tag, err := t.conn.Exec(ctx, "commit")
	if err != nil {
		if t.conn.PgConn().TxStatus() != 'I' {
			_ = t.conn.Close(ctx) // the error to return is the commit's
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *begunTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	defer t.release()
	if _, err := t.conn.Exec(ctx, "rollback"); err != nil {
		// The session's state is unknown: close it, as pgx does.
		_ = t.conn.Close(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// LargeObjects: pgx makes a LargeObjects only of a transaction of its own. The one made here, on
// first use, is a handle on the same session whose BEGIN is an empty statement (a comment): it
// begins nothing, and its statements run in this transaction. It is never ended: this one is.
// On a broken connection, where that fails, the LargeObjects returned is pgx's zero value.
func (t *begunTx) LargeObjects() pgx.LargeObjects {
	if t.lo == nil && !t.closed {
		if lo, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "-- large objects"}); err == nil {
			t.lo = lo
		}
	}
	if t.lo == nil {
		return pgx.LargeObjects{}
	}
	return t.lo.LargeObjects()
}

// savepointTx is a pseudo-nested transaction, as pgx's.
type savepointTx struct {
	statements
	tx *begunTx
	n  int64
}

var _ pgx.Tx = (*savepointTx)(nil)

// Begin makes a savepoint of the transaction, as pgx's nested transactions do.
func (sp *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.tx.Begin(ctx)
}

func (sp *savepointTx) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "release savepoint sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	return err
}

func (sp *savepointTx) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "rollback to savepoint sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	return err
}

func (sp *savepointTx) LargeObjects() pgx.LargeObjects { return sp.tx.LargeObjects() }

// errRows are the rows, and the row, of a statement refused before it was sent.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }

// errBatch is the result of a batch refused before it was sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return errRows(b), b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRows(b) }
func (b errBatch) Close() error                     { return b.err }
