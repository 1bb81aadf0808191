package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/pgerr"
	"github.com/outboxkit/outboxkit/internal/schema"
)

// ErrTxClosed is returned by Publish when the transaction it is bound to has already been
// committed or rolled back. Nothing is written.
var ErrTxClosed = errors.New("outbox publish: the transaction is already committed or rolled back; " +
	"publish inside the open transaction that writes the business change")

// ErrTxAborted is returned by Publish when an earlier statement failed inside the transaction.
// Postgres ignores every statement until the transaction is rolled back, so nothing is written.
var ErrTxAborted = errors.New("outbox publish: the transaction was aborted by an earlier error; roll it back")

// ErrDuplicateUUID is returned by Publish when a message's UUID is already in the outbox (or
// repeated within the call). The statement fails, which aborts the caller's transaction.
var ErrDuplicateUUID = errors.New("outbox publish: a message with this UUID is already in the outbox; " +
	"every message needs its own UUID")

// PublisherConfig configures a transaction-bound Publisher. The zero value is ready to use.
type PublisherConfig struct {
	// Schema is the Postgres schema holding the outbox table. Default "outboxkit".
	Schema string

	// DisableNotify stops Publish from waking the forwarders with pg_notify; they find the rows
	// at their next poll instead. Default false. See SchemaAdapter.DisableNotify.
	DisableNotify bool

	// Logger receives watermill-sql's trace logs. Default: none.
	Logger watermill.LoggerAdapter
}

// Publisher is a Watermill message.Publisher that writes messages into the outbox inside the
// caller's transaction. It never commits or rolls back: the messages become visible to the
// forwarder when, and only if, the caller commits.
//
// One Publish call inserts all its messages in one statement, in order. Build a Publisher per
// transaction (it is cheap); it is not safe for concurrent use, like the transaction under it.
type Publisher struct {
	inner  *wsql.Publisher
	schema schema.Name
}

// NewPublisher binds a publisher to a database/sql transaction (lib/pq, or pgx through its
// stdlib driver).
func NewPublisher(tx *sql.Tx, cfg PublisherConfig) (*Publisher, error) {
	if tx == nil {
		return nil, errors.New("pipeline.NewPublisher: tx is nil: begin a transaction and pass it")
	}
	return newPublisher(wsql.TxFromStdSQL(tx), cfg)
}

// NewPgxPublisher binds a publisher to a native pgx transaction.
func NewPgxPublisher(tx pgx.Tx, cfg PublisherConfig) (*Publisher, error) {
	if tx == nil {
		return nil, errors.New("pipeline.NewPgxPublisher: tx is nil: begin a transaction and pass it")
	}
	return newPublisher(wsql.TxFromPgx(tx), cfg)
}

func newPublisher(exec wsql.ContextExecutor, cfg PublisherConfig) (*Publisher, error) {
	name, err := schema.Parse(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("pipeline publisher: %w", err)
	}
	inner, err := wsql.NewPublisher(exec, wsql.PublisherConfig{
		SchemaAdapter: SchemaAdapter{Schema: string(name), DisableNotify: cfg.DisableNotify},
	}, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("pipeline publisher: %w", err)
	}
	return &Publisher{inner: inner, schema: name}, nil
}

// Publish inserts the messages into the outbox within the bound transaction. The first message's
// context bounds the statement. A call with no messages does nothing.
//
// On error nothing is written by this call; errors from the database (a duplicate UUID, for
// example) also abort the caller's transaction, as any failed statement does in Postgres.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	if len(messages) == 0 {
		return nil
	}
	err := p.inner.Publish(topic, messages...)
	if err == nil {
		return nil
	}
	var invalid *InvalidMessageError
	if errors.As(err, &invalid) {
		return invalid
	}
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%w (%v)", ErrTxClosed, err)
	}
	switch code, constraint := pgerr.Code(err); {
	case code == pgerr.InFailedTransaction:
		return fmt.Errorf("%w (%v)", ErrTxAborted, err)
	case code == pgerr.UniqueViolation && constraint == "outbox_uuid_key":
		return fmt.Errorf("%w (%v)", ErrDuplicateUUID, err)
	case code == pgerr.UndefinedTable:
		return fmt.Errorf("outbox publish: table %s.outbox does not exist: run pipeline.Migrate "+
			"(or `outboxctl migrate`) first: %w", p.schema.Ident(), err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("outbox publish: the message context ended before the insert ran: %w", err)
	}
	return fmt.Errorf("outbox publish: %w", err)
}

// Close makes later Publish calls fail. It does not touch the transaction.
func (p *Publisher) Close() error { return p.inner.Close() }
