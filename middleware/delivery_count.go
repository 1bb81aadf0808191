package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/dbtext"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// DeliveryCountConfig configures NewDeliveryCount.
type DeliveryCountConfig struct {
	// Store holds inbox_deliveries. Required. Each delivery in progress holds one of its
	// connections, with a session lock on the message: on Postgres, PgBouncer in transaction mode
	// cannot carry that lock.
	Store store.Store
	// Consumer names the consuming service; it keys the count. Required.
	Consumer string
	// CountFirstDeliveries counts a delivery even when the subscriber says the broker vouches it is
	// the message's first (outboxkit.WithRedelivered, set by outboxkit's RabbitMQ, NATS
	// JetStream, Redis Streams and Kafka subscribers). Default false: such a delivery writes nothing and takes no lock unless it fails,
	// and its redelivery counts it — two database round trips fewer per message. The price: a
	// message the broker had handed out (prefetched) but the handler never started, when the
	// consumer died, is counted once more than it was handled, as a quorum queue's delivery limit
	// counts it.
	CountFirstDeliveries bool
	// IsUnreachable recognises failures to reach a dependency: they are not recorded against the
	// message. Default IsUnreachableIn(Store).
	IsUnreachable func(error) bool
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

func (c DeliveryCountConfig) withDefaults() DeliveryCountConfig {
	if c.IsUnreachable == nil {
		c.IsUnreachable = IsUnreachableIn(c.Store)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	return c
}

func (c DeliveryCountConfig) validate() error {
	return errors.Join(requireStoreAndConsumer(c.Store, c.Consumer)...)
}

// NewDeliveryCount counts every delivery of a message to this consumer in inbox_deliveries, in a
// commit of its own before the inner handler runs, and exposes the count through Deliveries(ctx).
// Because the count is committed first, a message that crashes the process is counted too, and the
// dead-letter middleware can dead-letter it once it has been delivered too often.
//
// Deliveries of one message to one consumer are serialized: the middleware holds a connection
// with a lock on the message for the whole delivery (an advisory lock, GET_LOCK, SQLite's single
// writer), and the middlewares inside (the inbox's transaction, the dead-letter checks) work on
// that connection. Concurrent duplicates therefore wait and then find the message processed, rather
// than all counting as attempts; if the process dies, the database releases the lock.
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
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("delivery count config: %w", err)
	}
	dc := &deliveryCount{cfg: cfg}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return dc.handle(h, msg) }
	}, nil
}

type deliveryCount struct{ cfg DeliveryCountConfig }

func (dc *deliveryCount) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if msg.UUID == "" {
		return h(msg) // nothing to count by; the inbox dead-letters it
	}
	d := deliveryOf(msg)
	redelivered, known := outboxkit.Redelivered(msg.Context())
	if known && !redelivered && !dc.cfg.CountFirstDeliveries {
		return dc.vouchedFirst(h, msg, d)
	}
	first := 1
	if known && redelivered && !dc.cfg.CountFirstDeliveries {
		first = 2 // its first delivery was not counted unless it failed (then the row exists)
	}
	ctx := msg.Context()
	locked, count, err := dc.cfg.Store.LockMessage(ctx, dc.cfg.Consumer, msg.UUID,
		store.Count{Now: dc.cfg.Now(), First: first, Again: d.counted})
	if err != nil {
		return nil, err
	}
	d.locked, d.count, d.counted = locked, count, true
	defer func() {
		d.locked = nil
		locked.Unlock(ctx)
	}()
	out, err := h(msg)
	if err != nil && !d.deadLettered && !held(dc.cfg.IsUnreachable, err) {
		if rerr := locked.RecordFailure(ctx, dc.cfg.Consumer, msg.UUID, dbtext.Storable(err.Error())); rerr != nil {
			dc.cfg.Logger.Error("Cannot record the delivery's error", rerr, watermill.LogFields{
				"consumer": dc.cfg.Consumer, "message_uuid": msg.UUID,
			})
		}
	}
	return out, err
}

// vouchedFirst runs a delivery the broker vouches is the first without writing anything, unless
// it fails.
func (dc *deliveryCount) vouchedFirst(h message.HandlerFunc, msg *message.Message, d *delivery) ([]*message.Message, error) {
	d.count = 1
	out, err := h(msg)
	if err == nil || d.deadLettered || held(dc.cfg.IsUnreachable, err) {
		return out, err
	}
	// Recorded even when the delivery failed because its context ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
	defer cancel()
	if rerr := dc.cfg.Store.RecordFirstFailure(ctx, dc.cfg.Consumer, msg.UUID, dc.cfg.Now(), dbtext.Storable(err.Error())); rerr != nil {
		// Uncounted, the redelivery still counts as the second delivery.
		dc.cfg.Logger.Error("Cannot record the delivery's error", rerr, watermill.LogFields{
			"consumer": dc.cfg.Consumer, "message_uuid": msg.UUID,
		})
	}
	return out, err
}
