package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/internal/outboxmsg"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultDedupWindow is how long inbox rows are kept: the deduplication window.
const DefaultDedupWindow = 7 * 24 * time.Hour

// InboxConfig configures NewInbox.
type InboxConfig struct {
	// Store holds the inbox and the consumer's own tables. Required.
	Store store.Store
	// Consumer names the consuming service; each consumer deduplicates on its own. Required.
	Consumer string

	// DedupWindow is how long the inbox recognises a message: inbox rows older than it may be
	// pruned (PruneInbox), after which a redelivery could no longer be recognised. So a message
	// whose outbox row was written longer ago than DedupWindow, and which has no inbox row, is
	// dead-lettered as a possible duplicate instead of being processed as new. It must outlast the
	// broker's redelivery horizon and any replay you might do. Default DefaultDedupWindow (7 days).
	DedupWindow time.Duration

	// DisableFastPath skips the "seen already?" read before the transaction. The read saves a
	// transaction for duplicates; it is only an optimisation, the inbox insert decides either way.
	// Default false.
	DisableFastPath bool

	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives a debug line per duplicate. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

func (c InboxConfig) withDefaults() InboxConfig {
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	return c
}

func (c InboxConfig) validate() error {
	errs := requireStoreAndConsumer(c.Store, c.Consumer)
	if c.DedupWindow < 0 {
		errs = append(errs, fmt.Errorf("field DedupWindow must be positive, got %s", c.DedupWindow))
	}
	return errors.Join(errs...)
}

// ErrPossibleDuplicate is returned (permanent) for a message older than the dedup window that
// has no inbox row: its row may have been pruned, so processing it could repeat an effect.
var ErrPossibleDuplicate = errors.New("possible duplicate: the message is older than the dedup window, " +
	"so a record of processing it may have been pruned")

// NewInbox runs each message's handler in a transaction that first inserts the message's inbox
// row. A message already in the inbox is a duplicate: the transaction is rolled back, the handler
// does not run and the message is acknowledged. Otherwise the handler finds the transaction with
// outboxkit.TxFrom (a typed handler is given it), makes its effect through it, and the effect and
// the inbox row commit together. A handler error rolls both back and is returned, so the message is
// retried.
//
// Messages the handler returns (Watermill's AddHandler, whose router would publish them after the
// handler) are written into the outbox in the same transaction, to the handler's publish topic,
// and not returned: the forwarder relays them. A consumer's own events are then as safe as the
// writer's — published at least once whatever happens after the commit, and never published for
// an effect that rolled back — where the router's publish after the commit would lose them when
// it failed or the process died, the redelivery being absorbed as a duplicate.
func NewInbox(cfg InboxConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("inbox config: %w", err)
	}
	in := &inbox{cfg: cfg}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return in.handle(h, msg) }
	}, nil
}

type inbox struct{ cfg InboxConfig }

func (in *inbox) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if msg.UUID == "" {
		if why := msg.Metadata.Get(outboxkit.MetadataUndecodable); why != "" {
			return nil, handlers.Permanent(fmt.Errorf("%s (%w)", why, errUndecodable))
		}
		return nil, handlers.Permanent(errNoUUID)
	}
	d := deliveryOf(msg)
	ctx := msg.Context()
	session := d.session(in.cfg.Store)
	// On a first delivery (DeliveryCount says 1) there is nothing to find.
	if !in.cfg.DisableFastPath && d.count != 1 {
		seen, err := session.Seen(ctx, in.cfg.Consumer, msg.UUID)
		if err != nil {
			return nil, fmt.Errorf("inbox lookup for message %s: %w", msg.UUID, err)
		}
		if seen {
			return in.duplicate(msg, d, session)
		}
	}

	tx, err := session.BeginInbox(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin inbox transaction for message %s: %w", msg.UUID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	now := in.cfg.Now()
	inserted, err := tx.InsertInbox(ctx, in.cfg.Consumer, msg.UUID, now)
	if err != nil {
		return nil, fmt.Errorf("insert inbox row for message %s: %w", msg.UUID, err)
	}
	if !inserted {
		_ = tx.Rollback(ctx) // before counting, which updates the row this transaction waited on
		return in.duplicate(msg, d, session)
	}
	if created, ok := outboxkit.CreatedAt(msg); ok && now.Sub(created) > in.cfg.DedupWindow {
		return nil, handlers.Permanent(fmt.Errorf("message %s written %s ago, dedup window %s: %w",
			msg.UUID, now.Sub(created).Round(time.Second), in.cfg.DedupWindow, ErrPossibleDuplicate))
	}

	d.inbox = tx
	d.consumer, d.message = in.cfg.Consumer, msg.UUID
	msg.SetContext(outboxkit.WithTx(ctx, tx.User()))
	defer func() { msg.SetContext(ctx); d.inbox = nil }() // a retry must not see this transaction
	out, err := h(msg)
	if err != nil {
		return out, err
	}
	if err := in.emit(ctx, tx, msg, out); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit inbox transaction for message %s: %w", msg.UUID, err)
	}
	return nil, nil
}

func (in *inbox) duplicate(msg *message.Message, d *delivery, session store.Session) ([]*message.Message, error) {
	d.duplicate = true
	if err := session.CountDuplicate(msg.Context(), in.cfg.Consumer, msg.UUID); err != nil {
		in.cfg.Logger.Error("Cannot count a duplicate", err, watermill.LogFields{"consumer": in.cfg.Consumer, "message_uuid": msg.UUID})
	}
	in.cfg.Logger.Debug("Duplicate message acknowledged", watermill.LogFields{"consumer": in.cfg.Consumer, "message_uuid": msg.UUID})
	return nil, nil
}

// emit writes the messages a handler returned into the outbox, in the inbox's transaction, to the
// handler's publish topic.
func (in *inbox) emit(ctx context.Context, tx store.InboxTx, msg *message.Message, out []*message.Message) error {
	if len(out) == 0 {
		return nil
	}
	topic := publishTopic(ctx)
	if topic == "" {
		return fmt.Errorf("message %s: the handler returned %d messages but has no publish topic: register it with "+
			"Router.AddHandler and a publish topic, or publish inside the handler with pipeline.NewPublisher", msg.UUID, len(out))
	}
	for _, m := range out {
		if m.Context() == context.Background() {
			m.SetContext(ctx) // the consumer's trace context is stored with the row
		}
	}
	rows, err := outboxmsg.Rows(topic, out)
	if err == nil {
		err = tx.InsertOutbox(out[0].Context(), rows)
	}
	if err != nil {
		return fmt.Errorf("write the %d messages the handler of %s returned into the outbox: %w", len(out), msg.UUID, err)
	}
	return nil
}

// DefaultPruneBatchSize bounds the rows one pruning statement deletes.
const DefaultPruneBatchSize = 1000

// PruneConfig configures PruneInbox.
type PruneConfig struct {
	// Store holds the inbox. Required.
	Store store.Store
	// Consumer limits pruning to one consumer. Default: all consumers.
	Consumer string
	// BatchSize bounds the rows one DELETE removes, so pruning never holds long locks.
	// Default DefaultPruneBatchSize.
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
// run, and equal to the inbox middleware's DedupWindow, which dead-letters messages older than it.
func PruneInbox(ctx context.Context, cfg PruneConfig, olderThan time.Duration) (int, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, errors.New("field Store is required"))
	}
	if cfg.Consumer != "" {
		if err := validConsumer(cfg.Consumer); err != nil {
			errs = append(errs, err)
		}
	}
	if olderThan <= 0 {
		errs = append(errs, fmt.Errorf("olderThan must be positive, got %s", olderThan))
	}
	if cfg.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("field BatchSize must be positive, got %d", cfg.BatchSize))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("prune inbox: %w", err)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultPruneBatchSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cutoff := cfg.Now().Add(-olderThan)
	deleted := 0
	for i, prune := range []func(context.Context, string, time.Time, int) (int, error){cfg.Store.PruneInbox, cfg.Store.PruneDeliveries} {
		for {
			n, err := prune(ctx, cfg.Consumer, cutoff, cfg.BatchSize)
			if err != nil {
				return deleted, fmt.Errorf("prune inbox: %w", err)
			}
			if i == 0 { // inbox rows; delivery counts are not reported
				deleted += n
			}
			if n < cfg.BatchSize {
				break
			}
		}
	}
	return deleted, nil
}

type publishTopicKey struct{}

// withPublishTopic gives the handler's output a topic where no Watermill router sets one (the
// batch consumer).
func withPublishTopic(ctx context.Context, topic string) context.Context {
	if topic == "" {
		return ctx
	}
	return context.WithValue(ctx, publishTopicKey{}, topic)
}

// publishTopic is the topic a handler's output goes to: the batch consumer's, or the router's.
func publishTopic(ctx context.Context) string {
	if t, ok := ctx.Value(publishTopicKey{}).(string); ok {
		return t
	}
	return message.PublishTopicFromCtx(ctx)
}

type subscribeTopicKey struct{}

// withSubscribeTopic names the topic a message came from where no Watermill router does (the
// batch consumer).
func withSubscribeTopic(ctx context.Context, topic string) context.Context {
	return context.WithValue(ctx, subscribeTopicKey{}, topic)
}

// subscribeTopic is the topic a message came from, as its dead letter, parked row and span record
// it: the batch consumer's, or the router's.
func subscribeTopic(ctx context.Context) string {
	if t, ok := ctx.Value(subscribeTopicKey{}).(string); ok {
		return t
	}
	return message.SubscribeTopicFromCtx(ctx)
}
