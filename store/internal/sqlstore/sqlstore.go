package sqlstore

import (
	"context"
	"sync/atomic"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// Store is store.Store over a DB and a Dialect.
type Store struct {
	db dbexec.DB
	d  Dialect
	q  *Queries

	relaysForgotten atomic.Int64 // the heartbeat time (Unix ns) at which old relays were last forgotten
}

var _ store.Store = (*Store)(nil)

// New returns the store of db in dialect d.
func New(db dbexec.DB, d Dialect) *Store { return &Store{db: db, d: d, q: d.Queries()} }

// DB is the store's connection pool.
func (s *Store) DB() dbexec.DB { return s.db }

// Dialect is the store's dialect.
func (s *Store) Dialect() Dialect { return s.d }

// UnwrapTx is the store's view of an application's transaction.
func (s *Store) UnwrapTx(tx dbexec.Tx) store.Tx { return userTx{s: s, tx: tx} }

// IsUnreachable reports whether the dialect reads err as the database failing to answer.
func (s *Store) IsUnreachable(err error) bool {
	return err != nil && outboxkit.IsUnreachable(s.d.Classify(err))
}

func (s *Store) Info() store.Info { return s.d.Info() }

// Classify translates a driver error the way the store's own errors are: unreachable, access
// denied, missing tables (see Dialect.Classify).
func (s *Store) Classify(err error) error { return s.d.Classify(err) }

// inTx runs fn in a transaction of the pool, committing when it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(dbexec.Tx) error) error {
	tx, err := s.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return s.d.Classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return s.d.Classify(err)
	}
	return s.d.Classify(tx.Commit(ctx))
}

// userTx is a transaction as outboxkit uses it.
type userTx struct {
	s  *Store
	tx dbexec.Tx
}

func (t userTx) InsertOutbox(ctx context.Context, msgs []store.OutboxMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	return t.s.d.Classify(t.s.d.InsertOutbox(ctx, t.tx, msgs))
}

func (t userTx) User() any { return t.tx.User() }

func (t userTx) Commit(ctx context.Context) error   { return t.s.d.Classify(t.tx.Commit(ctx)) }
func (t userTx) Rollback(ctx context.Context) error { return t.s.d.Classify(t.tx.Rollback(ctx)) }
