package pgxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec/pgxexec"
	"github.com/outboxkit/outboxkit/store/internal/pg"
)

// ErrTxOwned is returned by Commit and Rollback on the transaction Transact hands to fn: Transact
// ends it when fn returns (return an error from fn to roll back).
var ErrTxOwned = errors.New("pgxstore.Transact ends this transaction when fn returns: return nil to commit, an error to roll back")

// Transact runs fn in a transaction on the store's pool, with a Publisher bound to it, and commits.
// The messages fn publishes are checked when it publishes them (an invalid message is refused
// there, as pipeline.Publisher refuses it) and written in the same round trip as the COMMIT: the
// outbox row costs the transaction no round trip of its own, where Publish followed by Commit
// pays one for each.
//
// It keeps the transaction's semantics: the business change and its outbox rows commit together
// or not at all. fn's error or panic rolls the transaction back (and is returned or re-raised);
// when the rows cannot be written — a message id already in the outbox (ErrDuplicateUUID), a
// database error — the COMMIT sent with them is not run, the transaction is rolled back and
// Transact returns the error. What moves is where such an error surfaces: from Transact, not from
// Publish. A failed COMMIT (a serialization failure, a deferred constraint) returns its error and
// nothing is committed; a connection lost during the round trip leaves the outcome unknown, as
// with any COMMIT, and the error is marked outboxkit.Unreachable.
//
// fn must not commit or roll back tx itself (Commit and Rollback return ErrTxOwned); savepoints
// (tx.Begin) work as usual; opts.CommitQuery, when set, is the COMMIT sent. The connection is
// taken from Pool for the transaction and given back after it.
func (s *Store) Transact(ctx context.Context, opts pgx.TxOptions, fn func(tx pgx.Tx, pub *pipeline.Publisher) error) error {
	if fn == nil {
		return errors.New("pgxstore.Transact: fn is nil: pass the function that makes the business change and publishes its events")
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.d.Classify(err)
	}
	// Release hands the connection back to the pool only when its session is outside any
	// transaction; otherwise it closes it.
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return s.d.Classify(err)
	}
	ended := false
	defer func() {
		if !ended {
			// fn failed or panicked, or the rows could not be written: nothing commits.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	buf := &bufferTx{user: tx}
	pub, err := pipeline.NewPublisher[pgx.Tx](buffering{s, buf}, tx, pipeline.PublisherConfig{})
	if err != nil {
		return err
	}
	if err := fn(ownedTx{tx}, pub); err != nil {
		return err
	}
	_ = pub.Close()

	if len(buf.rows) == 0 {
		ended = true
		return s.d.Classify(tx.Commit(ctx))
	}
	switch st := conn.Conn().PgConn().TxStatus(); st {
	case 'T':
	case 'E':
		return fmt.Errorf("pgxstore.Transact: the outbox rows were not written: %w", store.ErrTxAborted)
	default:
		// Outside a transaction the INSERT would commit on its own: refuse it.
		return fmt.Errorf("pgxstore.Transact: the transaction ended inside fn (session status %q); the outbox rows were not written", st)
	}
	if err := s.d.CheckWALRelay(ctx, pgxexec.Tx(tx)); err != nil {
		return err
	}
	query, args, err := s.d.OutboxInsert(buf.rows)
	if err != nil {
		return err
	}
	// One pipeline, one Sync: when the INSERT fails, Postgres skips the COMMIT queued after it.
	batch := &pgx.Batch{}
	batch.Queue(query, args...)
	commit := "commit"
	if opts.CommitQuery != "" {
		commit = opts.CommitQuery
	}
	batch.Queue(commit)
	br := conn.SendBatch(ctx, batch)
	_, insertErr := br.Exec()
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	switch {
	case insertErr != nil:
		return fmt.Errorf("outbox publish: %w", s.d.Classify(insertErr))
	case commitErr != nil:
		// A COMMIT that fails ends the transaction; there is nothing left to roll back.
		ended = conn.Conn().PgConn().TxStatus() == 'I'
		return s.d.Classify(commitErr)
	case closeErr != nil:
		ended = conn.Conn().PgConn().TxStatus() == 'I'
		return s.d.Classify(closeErr)
	case tag.String() == "ROLLBACK":
		ended = true
		return pgx.ErrTxCommitRollback
	}
	// The session is outside any transaction now; tx, which pgx still takes for open, is
	// dropped with the connection's release.
	ended = true
	return nil
}

// buffering is the store as the Publisher Transact binds sees it: its rows go into a buffer.
type buffering struct {
	*Store
	buf *bufferTx
}

func (b buffering) UnwrapTx(pgx.Tx) store.Tx { return b.buf }

// bufferTx keeps the rows the Publisher validated, in order, for the INSERT sent with the COMMIT.
type bufferTx struct {
	user pgx.Tx
	rows []store.OutboxMessage
}

func (b *bufferTx) InsertOutbox(_ context.Context, msgs []store.OutboxMessage) error {
	if len(b.rows)+len(msgs) > pg.MaxMessagesPerInsert {
		return fmt.Errorf("%d messages in one transaction; Transact sends at most %d with the COMMIT: publish the rest in another transaction",
			len(b.rows)+len(msgs), pg.MaxMessagesPerInsert)
	}
	b.rows = append(b.rows, msgs...)
	return nil
}

func (b *bufferTx) User() any { return b.user }

// ownedTx is the transaction fn sees: everything but ending it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error { return ErrTxOwned }

func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
