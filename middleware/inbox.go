package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/pipeline"
)

// DefaultInboxRetention is how long inbox rows are kept, and so the deduplication window.
const DefaultInboxRetention = 7 * 24 * time.Hour

// InboxConfig configures NewInbox.
type InboxConfig struct {
	// Pool reaches the database holding the inbox and the consumer's own tables. Required.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Consumer names the consuming service; each consumer deduplicates on its own. Required.
	Consumer string

	// Retention is the deduplication window: inbox rows older than it may be pruned (PruneInbox),
	// after which a redelivery could no longer be recognised. So a message whose outbox row was
	// written longer ago than Retention, and which has no inbox row, is quarantined as a possible
	// duplicate instead of being processed as new. It must outlast the broker's redelivery horizon
	// and any replay you might do. Default DefaultInboxRetention (7 days).
	Retention time.Duration

	// DisableFastPath skips the "seen already?" read before the transaction. The read saves a
	// transaction for duplicates; it is only an optimisation, the inbox insert decides either way.
	// Default false.
	DisableFastPath bool

	// TxOptions for the inbox transaction. Default: the database's default (read committed).
	TxOptions pgx.TxOptions

	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives a debug line per duplicate. Default: none.
	Logger watermill.LoggerAdapter
}

// ErrPossibleDuplicate is returned (permanent) for a message older than the inbox retention that
// has no inbox row: its row may have been pruned, so processing it could repeat an effect.
var ErrPossibleDuplicate = errors.New("possible duplicate: the message is older than the inbox retention, " +
	"so a record of processing it may have been pruned")

// NewInbox runs each message's handler in a transaction that first inserts the message's inbox
// row. A message already in the inbox is a duplicate: the transaction is rolled back, the handler
// does not run and the message is acknowledged. Otherwise the handler finds the transaction with
// handlers.TxFrom, makes its effect through it, and the effect and the inbox row commit together.
// A handler error rolls both back and is returned, so the message is retried.
//
// Messages the handler returns (Watermill's AddHandler, whose router would publish them after the
// handler) are written into the outbox in the same transaction, to the handler's publish topic,
// and not returned: the forwarder relays them. A consumer's own events are then as safe as the
// writer's — published at least once whatever happens after the commit, and never published for
// an effect that rolled back — where the router's publish after the commit would lose them when
// it failed or the process died, the redelivery being absorbed as a duplicate.
func NewInbox(cfg InboxConfig) (message.HandlerMiddleware, error) {
	b, err := newBase(cfg.Pool, cfg.Schema, cfg.Consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox config: %w", err)
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultInboxRetention
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("inbox config: field Retention must be positive, got %s", cfg.Retention)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	insert := b.schema.Render(querySQL("insert_inbox.sql"))
	seen := b.schema.Render(querySQL("seen.sql"))
	countDuplicate := b.schema.Render(querySQL("count_duplicate.sql"))

	duplicate := func(msg *message.Message, d *delivery) ([]*message.Message, error) {
		d.duplicate = true
		if _, err := d.db(b.pool).Exec(msg.Context(), countDuplicate, b.consumer, msg.UUID); err != nil {
			cfg.Logger.Error("Cannot count a duplicate", err, watermill.LogFields{"consumer": b.consumer, "message_uuid": msg.UUID})
		}
		cfg.Logger.Debug("Duplicate message acknowledged", watermill.LogFields{
			"consumer": b.consumer, "message_uuid": msg.UUID,
		})
		return nil, nil
	}

	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if msg.UUID == "" {
				return nil, handlers.Permanent(errNoUUID)
			}
			d := deliveryOf(msg)
			ctx := msg.Context()
			// On a first delivery (DeliveryCount says 1) there is nothing to find.
			if !cfg.DisableFastPath && d.count != 1 {
				var found bool
				if err := d.db(b.pool).QueryRow(ctx, seen, b.consumer, msg.UUID).Scan(&found); err != nil {
					return nil, fmt.Errorf("inbox lookup for message %s: %w", msg.UUID, err)
				}
				if found {
					return duplicate(msg, d)
				}
			}

			tx, err := d.db(b.pool).BeginTx(ctx, cfg.TxOptions)
			if err != nil {
				return nil, fmt.Errorf("begin inbox transaction for message %s: %w", msg.UUID, err)
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
			now := cfg.Now()
			tag, err := tx.Exec(ctx, insert, b.consumer, msg.UUID, now)
			if err != nil {
				return nil, fmt.Errorf("insert inbox row for message %s: %w", msg.UUID, err)
			}
			if tag.RowsAffected() == 0 {
				_ = tx.Rollback(ctx) // before counting, which updates the row this transaction waited on
				return duplicate(msg, d)
			}
			if created, ok := outboxkit.CreatedAt(msg); ok && now.Sub(created) > cfg.Retention {
				return nil, handlers.Permanent(fmt.Errorf("message %s written %s ago, inbox retention %s: %w",
					msg.UUID, now.Sub(created).Round(time.Second), cfg.Retention, ErrPossibleDuplicate))
			}

			msg.SetContext(handlers.WithTx(ctx, tx))
			defer msg.SetContext(ctx) // a retry must not see this transaction
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			if err := emit(ctx, tx, b, msg, out); err != nil {
				return nil, err
			}
			if err := tx.Commit(ctx); err != nil {
				return nil, fmt.Errorf("commit inbox transaction for message %s: %w", msg.UUID, err)
			}
			return nil, nil
		}
	}, nil
}

// emit writes the messages a handler returned into the outbox, in the inbox's transaction, to the
// handler's publish topic.
func emit(ctx context.Context, tx pgx.Tx, b base, msg *message.Message, out []*message.Message) error {
	if len(out) == 0 {
		return nil
	}
	topic := message.PublishTopicFromCtx(ctx)
	if topic == "" {
		return fmt.Errorf("message %s: the handler returned %d messages but has no publish topic: register it with "+
			"Router.AddHandler and a publish topic, or publish inside the handler with pipeline.NewPgxPublisher", msg.UUID, len(out))
	}
	for _, m := range out {
		if m.Context() == context.Background() {
			m.SetContext(ctx) // the consumer's trace context is stored with the row
		}
	}
	pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(b.schema)})
	if err != nil {
		return err
	}
	if err := pub.Publish(topic, out...); err != nil {
		return fmt.Errorf("write the %d messages the handler of %s returned into the outbox: %w", len(out), msg.UUID, err)
	}
	return nil
}

// PruneConfig configures PruneInbox.
type PruneConfig struct {
	// Pool reaches the database holding the inbox. Required.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Consumer limits pruning to one consumer. Default: all consumers.
	Consumer string
	// BatchSize bounds the rows one DELETE removes, so pruning never holds long locks. Default 1000.
	BatchSize int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// PruneInbox deletes inbox rows processed more than olderThan ago, and delivery counts not seen
// for that long, in bounded batches (each its own short transaction). It returns the inbox rows
// deleted.
//
// olderThan is the deduplication window: a redelivery arriving after its inbox row is gone would be
// processed again. Keep it longer than the broker's redelivery horizon and any replay you might
// run, and equal to the inbox middleware's Retention, which quarantines messages older than it.
func PruneInbox(ctx context.Context, cfg PruneConfig, olderThan time.Duration) (int, error) {
	if cfg.Consumer != "" && !consumerName.MatchString(cfg.Consumer) {
		return 0, fmt.Errorf("prune inbox: consumer name %q is not valid", cfg.Consumer)
	}
	b, err := newBase(cfg.Pool, cfg.Schema, "all")
	if err != nil {
		return 0, fmt.Errorf("prune inbox: %w", err)
	}
	if olderThan <= 0 {
		return 0, fmt.Errorf("prune inbox: olderThan must be positive, got %s", olderThan)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cutoff := cfg.Now().Add(-olderThan)
	deleted := 0
	for _, q := range []string{"prune_inbox.sql", "prune_deliveries.sql"} {
		query := b.schema.Render(querySQL(q))
		for {
			tag, err := b.pool.Exec(ctx, query, cfg.Consumer, cutoff, cfg.BatchSize)
			if err != nil {
				return deleted, fmt.Errorf("prune inbox: %w", err)
			}
			if q == "prune_inbox.sql" {
				deleted += int(tag.RowsAffected())
			}
			if int(tag.RowsAffected()) < cfg.BatchSize {
				break
			}
		}
	}
	return deleted, nil
}
