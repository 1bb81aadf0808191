package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/pgtext"
)

// DefaultMaxDeliveries is how many deliveries a message gets before it is quarantined.
const DefaultMaxDeliveries = 5

// DeadLetterConfig configures NewDeadLetter.
type DeadLetterConfig struct {
	// Pool reaches the database holding dead_letters. Required.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Consumer names the consuming service. Required.
	Consumer string

	// MaxDeliveries is how many deliveries a message gets: it is quarantined when the handler
	// fails on the last one, or before the handler runs when it arrives more often than that (the
	// earlier deliveries never finished: the handler may be crashing the process). It needs
	// DeliveryCount further out in the stack; without it only permanent errors quarantine.
	// Default DefaultMaxDeliveries (5).
	MaxDeliveries int

	// DisableTable stops quarantined messages from being stored in the dead_letters table, from
	// which ReplayDeadLetters re-publishes them. Default false: they are stored. At least one of
	// the table and a poison topic must be used.
	DisableTable bool

	// PoisonPublisher and PoisonTopic, when set, also send quarantined messages to a poison topic
	// through Watermill's PoisonQueue middleware, with its metadata (reason_poisoned,
	// topic_poisoned, handler_poisoned, subscriber_poisoned). Default: no poison topic.
	PoisonPublisher message.Publisher
	PoisonTopic     string

	// IsUnreachable recognises failures to reach a dependency: they are never quarantined, not
	// even on the last allowed delivery, since the message is not at fault. Default IsUnreachable.
	IsUnreachable func(error) bool

	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives one line per quarantined message. Default: none.
	Logger watermill.LoggerAdapter
}

// quarantined carries a message from our middleware to Watermill's PoisonQueue.
type quarantined struct{ reason string }

func (q *quarantined) Error() string { return "quarantined: " + q.reason }

// NewDeadLetter quarantines a message that cannot be processed — one the handler failed with a
// permanent error, failed on its last allowed delivery, or never finished within MaxDeliveries —
// and acknowledges it, so the queue keeps flowing behind it. A message delivered more often than
// MaxDeliveries that was in fact processed (duplicates) is acknowledged as a duplicate instead. Other errors are returned, so the
// message is retried. If storing or sending the quarantined message fails, the message is not
// acknowledged: nothing is ever dropped.
func NewDeadLetter(cfg DeadLetterConfig) (message.HandlerMiddleware, error) {
	b, err := newBase(cfg.Pool, cfg.Schema, cfg.Consumer)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if cfg.MaxDeliveries == 0 {
		cfg.MaxDeliveries = DefaultMaxDeliveries
	}
	if cfg.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("field MaxDeliveries must be at least 1, got %d", cfg.MaxDeliveries))
	}
	if (cfg.PoisonPublisher == nil) != (cfg.PoisonTopic == "") {
		errs = append(errs, errors.New("fields PoisonPublisher and PoisonTopic go together: set both or neither"))
	}
	if cfg.DisableTable && cfg.PoisonPublisher == nil {
		errs = append(errs, errors.New("field DisableTable leaves quarantined messages nowhere: set PoisonPublisher and PoisonTopic"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("dead letter config: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.IsUnreachable == nil {
		cfg.IsUnreachable = IsUnreachable
	}
	insert := b.schema.Render(querySQL("quarantine.sql"))
	inboxInsert := b.schema.Render(querySQL("insert_inbox.sql"))

	// processed tells a crash loop from duplicates: every delivery of a message counts, duplicates
	// too, so a message processed long ago can exceed MaxDeliveries as well. Deliveries of one
	// message are serialized by DeliveryCount, so inserting the inbox row in a transaction that is
	// rolled back answers exactly: it conflicts only if the message was processed.
	processed := func(msg *message.Message, d *delivery) (bool, error) {
		ctx := msg.Context()
		tx, err := d.db(b.pool).BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		tag, err := tx.Exec(ctx, inboxInsert, b.consumer, msg.UUID, cfg.Now())
		if err != nil {
			return false, err
		}
		return tag.RowsAffected() == 0, nil
	}

	quarantine := func(msg *message.Message, d *delivery, reason string) error {
		reason = pgtext.Storable(reason)
		if !cfg.DisableTable {
			metadata, err := json.Marshal(msg.Metadata)
			if err != nil || msg.Metadata == nil {
				metadata = []byte("{}")
			}
			payload := []byte(msg.Payload)
			if payload == nil {
				payload = []byte{}
			}
			topic := message.SubscribeTopicFromCtx(msg.Context())
			if _, err := d.db(b.pool).Exec(msg.Context(), insert, b.consumer, topic, msg.UUID, payload,
				string(metadata), reason, d.count, cfg.Now()); err != nil {
				return fmt.Errorf("quarantine message %s (%s): %w", msg.UUID, reason, err)
			}
		}
		d.deadLettered = true
		cfg.Logger.Info("Message quarantined", watermill.LogFields{
			"consumer": b.consumer, "message_uuid": msg.UUID, "deliveries": d.count, "reason": reason,
		})
		if cfg.PoisonPublisher != nil {
			return &quarantined{reason: reason}
		}
		return nil
	}

	deadLetter := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d := deliveryOf(msg)
			if d.count > cfg.MaxDeliveries && msg.UUID != "" {
				done, err := processed(msg, d)
				if err != nil {
					return nil, fmt.Errorf("check whether message %s was processed: %w", msg.UUID, err)
				}
				if done {
					d.duplicate = true
					return nil, nil
				}
				return nil, quarantine(msg, d, fmt.Sprintf(
					"delivered %d times without finishing (at most %d allowed): the handler may be crashing the process",
					d.count, cfg.MaxDeliveries))
			}
			out, err := h(msg)
			switch {
			case err == nil:
				return out, nil
			case cfg.IsUnreachable(err) && !handlers.IsPermanent(err):
				return out, err // not the message's fault: the circuit waits for the dependency
			case handlers.IsPermanent(err):
				return nil, quarantine(msg, d, err.Error())
			case d.count >= cfg.MaxDeliveries:
				return nil, quarantine(msg, d, fmt.Sprintf("failed on delivery %d of %d: %v", d.count, cfg.MaxDeliveries, err))
			}
			return out, err
		}
	}
	if cfg.PoisonPublisher == nil {
		return deadLetter, nil
	}
	poison, err := wmiddleware.PoisonQueueWithFilter(cfg.PoisonPublisher, cfg.PoisonTopic, func(err error) bool {
		var q *quarantined
		return errors.As(err, &q)
	})
	if err != nil {
		return nil, fmt.Errorf("dead letter config: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc { return poison(deadLetter(h)) }, nil
}
