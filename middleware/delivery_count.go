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
	"github.com/outboxkit/outboxkit/internal/pgtext"
)

// DeliveryCountConfig configures NewDeliveryCount.
type DeliveryCountConfig struct {
	// Pool reaches the database holding inbox_deliveries. Required. Each delivery in progress holds
	// one of its connections, in session mode: PgBouncer in transaction mode cannot carry the
	// session lock this middleware takes.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Consumer names the consuming service; it keys the count. Required.
	Consumer string
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger. Default: none.
	Logger watermill.LoggerAdapter
	// CountFirstDeliveries counts a delivery even when the subscriber says the broker vouches it is
	// the message's first (outboxkit.WithRedelivered, set by outboxkit's RabbitMQ subscriber).
	// Default false: such a delivery writes nothing and takes no lock unless it fails, and its
	// redelivery counts it — two database round trips fewer per message. The price: a message the
	// broker had handed out (prefetched) but the handler never started, when the consumer died,
	// is counted once more than it was handled, as a quorum queue's delivery limit counts it.
	CountFirstDeliveries bool
	// IsUnreachable recognises failures to reach a dependency: they are not recorded against the
	// message. Default IsUnreachable.
	IsUnreachable func(error) bool
}

// NewDeliveryCount counts every delivery of a message to this consumer in inbox_deliveries, in a
// commit of its own before the inner handler runs, and exposes the count through Deliveries(ctx).
// Because the count is committed first, a message that crashes the process is counted too, and the
// dead-letter middleware can quarantine it once it has been delivered too often.
//
// Deliveries of one message to one consumer are serialized: the middleware holds a connection with
// a session-level advisory lock on the message for the whole delivery, and the middlewares inside
// (the inbox's transaction, the dead-letter checks) work on that connection. Concurrent duplicates
// therefore wait and then find the message processed, rather than all counting as attempts; if the
// process dies, Postgres ends the session and releases the lock.
//
// If the count cannot be written the message is not handled: running the handler uncounted could
// let a poison message loop forever. The error goes out to the Circuit, which holds the message
// until the database answers again. A delivery that the Circuit runs again after such an outage is
// counted once: each broker delivery counts one, however often it is tried in-process.
//
// A delivery the broker vouches is the first (see CountFirstDeliveries) is counted as 1 without a
// write: if it fails, the failure is counted then; if it kills the process, the broker's
// redelivery says so, and that delivery is counted as the second. Concurrent first deliveries of
// duplicate copies are not serialized by the lock; the inbox's insert-first still lets exactly
// one of them through.
func NewDeliveryCount(cfg DeliveryCountConfig) (message.HandlerMiddleware, error) {
	b, err := newBase(cfg.Pool, cfg.Schema, cfg.Consumer)
	if err != nil {
		return nil, fmt.Errorf("delivery count config: %w", err)
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
	count := b.schema.Render(querySQL("count_delivery.sql"))
	counted := b.schema.Render(querySQL("delivery_count.sql"))
	failed := b.schema.Render(querySQL("delivery_failed.sql"))
	firstFailed := b.schema.Render(querySQL("first_delivery_failed.sql"))
	lock, unlock := querySQL("lock_message.sql"), querySQL("unlock_message.sql")
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (_ []*message.Message, err error) {
			if msg.UUID == "" {
				return h(msg) // nothing to count by; the inbox quarantines it
			}
			d := deliveryOf(msg)
			ctx := msg.Context()
			redelivered, known := outboxkit.Redelivered(ctx)
			if known && !redelivered && !cfg.CountFirstDeliveries {
				d.count = 1
				out, err := h(msg)
				if err != nil && !d.deadLettered && !cfg.IsUnreachable(err) {
					// Recorded even when the delivery failed because its context ended.
					rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					_, uerr := b.pool.Exec(rctx, firstFailed, b.consumer, msg.UUID, cfg.Now(), pgtext.Storable(err.Error()))
					cancel()
					if uerr != nil {
						// Uncounted, the redelivery still counts as the second delivery.
						cfg.Logger.Error("Cannot record the delivery's error", uerr, watermill.LogFields{
							"consumer": b.consumer, "message_uuid": msg.UUID,
						})
					}
				}
				return out, err
			}
			firstCount := 1
			if known && redelivered && !cfg.CountFirstDeliveries {
				firstCount = 2 // its first delivery was not counted unless it failed (then the row exists)
			}
			conn, err := b.pool.Acquire(ctx)
			if err != nil {
				return nil, fmt.Errorf("acquire a connection for message %s: %w", msg.UUID, err)
			}
			// Lock and count in one round trip; the count runs only once the lock is held. A
			// delivery tried again in-process (the Circuit, after an outage) is not counted again.
			batch := &pgx.Batch{}
			batch.Queue(lock, b.consumer, msg.UUID)
			if d.counted {
				batch.Queue(counted, b.consumer, msg.UUID).QueryRow(func(r pgx.Row) error { return r.Scan(&d.count) })
			} else {
				batch.Queue(count, b.consumer, msg.UUID, cfg.Now(), firstCount).QueryRow(func(r pgx.Row) error { return r.Scan(&d.count) })
			}
			results := conn.SendBatch(ctx, batch)
			_, lockErr := results.Exec()
			if lockErr != nil {
				_ = results.Close()
				conn.Release()
				return nil, fmt.Errorf("lock message %s: %w", msg.UUID, lockErr)
			}
			d.conn = conn
			defer func() {
				d.conn = nil
				// A connection that cannot say whether it still holds the lock is not returned to
				// the pool: closing it ends the session, and the lock with it.
				var unlocked bool
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if uerr := conn.QueryRow(uctx, unlock, b.consumer, msg.UUID).Scan(&unlocked); uerr != nil || !unlocked {
					_ = conn.Conn().Close(uctx)
				}
				conn.Release()
			}()

			if err := results.Close(); err != nil {
				return nil, fmt.Errorf("count delivery of message %s: %w", msg.UUID, err)
			}
			d.counted = true
			out, err := h(msg)
			if err != nil && !d.deadLettered && !cfg.IsUnreachable(err) {
				if _, uerr := conn.Exec(ctx, failed, b.consumer, msg.UUID, pgtext.Storable(err.Error())); uerr != nil {
					cfg.Logger.Error("Cannot record the delivery's error", uerr, watermill.LogFields{
						"consumer": b.consumer, "message_uuid": msg.UUID,
					})
				}
			}
			return out, err
		}
	}, nil
}

// errNoUUID rejects messages the inbox cannot deduplicate; the inbox marks it permanent.
var errNoUUID = errors.New("message has no UUID: outboxkit deduplicates on it; publish through the outbox, " +
	"or give every message a unique UUID")
