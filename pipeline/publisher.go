package pipeline

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/internal/outboxmsg"
	"github.com/outboxkit/outboxkit/store"
)

// Errors Publish returns (wrapped), whatever the store. Nothing is written when Publish fails.
var (
	// ErrTxDone: the transaction was already committed or rolled back.
	ErrTxDone = store.ErrTxDone
	// ErrTxAborted: an earlier statement failed inside the transaction (Postgres ignores every
	// statement until it is rolled back).
	ErrTxAborted = store.ErrTxAborted
	// ErrDuplicateUUID: a message's UUID is already in the outbox, or repeated within the call.
	// The failed statement aborts the caller's transaction on Postgres.
	ErrDuplicateUUID = store.ErrDuplicateUUID
)

// InvalidMessageError says why a message cannot be stored in the outbox.
type InvalidMessageError = outboxmsg.InvalidError

// PublisherConfig configures a transaction-bound Publisher. The zero value is ready to use.
type PublisherConfig struct{}

// Publisher is a Watermill message.Publisher that writes messages into the outbox inside the
// application's transaction. It never commits or rolls back: the messages become visible to the
// forwarder when, and only if, the application commits.
//
// One Publish call writes its messages in order, in one statement where the store can. Build a
// Publisher per transaction (it is cheap); like the transaction under it, it is not safe for
// concurrent use.
type Publisher struct {
	tx     store.Tx
	closed bool
}

// NewPublisher binds a publisher to tx, a transaction of the application's database library
// (pgx.Tx with store/pgxstore, *sql.Tx with the database/sql drivers) on the database s keeps.
func NewPublisher[TTx any](s store.Driver[TTx], tx TTx, _ PublisherConfig) (*Publisher, error) {
	if s == nil {
		return nil, errors.New("pipeline.NewPublisher: the store is nil: pass the store of the database holding the outbox")
	}
	if v := reflect.ValueOf(any(tx)); !v.IsValid() || (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
		return nil, fmt.Errorf("pipeline.NewPublisher: tx is a nil %v: begin a transaction and pass it", reflect.TypeFor[TTx]())
	}
	return &Publisher{tx: s.UnwrapTx(tx)}, nil
}

// Publish writes the messages into the outbox within the bound transaction. The first message's
// context bounds the statement. A call with no messages does nothing.
//
// On error nothing is written by this call; an error from the database (a duplicate UUID, for
// example) also aborts the caller's transaction on Postgres, as any failed statement does.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	if p.closed {
		return errors.New("outbox publish: the publisher is closed")
	}
	if len(messages) == 0 {
		return nil
	}
	rows, err := outboxmsg.Rows(topic, messages)
	if err != nil {
		return err
	}
	ctx := messages[0].Context()
	if err := p.tx.InsertOutbox(ctx, rows); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("outbox publish: the message context ended before the insert ran: %w", err)
		}
		return fmt.Errorf("outbox publish: %w", err)
	}
	return nil
}

// Close makes later Publish calls fail. It does not touch the transaction.
func (p *Publisher) Close() error {
	p.closed = true
	return nil
}
