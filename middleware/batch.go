package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultMaxBatch is the default of BatchConfig.MaxBatch.
const DefaultMaxBatch = 100

// BatchConfig configures NewBatchConsumer.
type BatchConfig struct {
	// StackConfig is the consumer's per-message stack (Store and Consumer are required). A batch
	// keeps its semantics, and falls back to it, one message at a time, for whatever a batch does
	// not settle (see NewBatchConsumer).
	StackConfig
	// MaxBatch bounds the messages in one transaction. Default DefaultMaxBatch (100).
	MaxBatch int
	// Linger is how long a batch that is not full waits for more messages after the first. Default
	// 0: a batch is what has arrived by the time the previous one committed, so an idle consumer
	// adds no delay and a busy one batches by itself.
	Linger time.Duration
	// PublishTopic is where messages the handler returns go, through the outbox in the batch's
	// transaction. Default "": a handler that returns messages fails.
	PublishTopic string
}

func (c BatchConfig) withDefaults() BatchConfig {
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	return c
}

func (c BatchConfig) validate() error {
	errs := requireStoreAndConsumer(c.Store, c.Consumer)
	if c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("field MaxBatch must be at least 1, got %d", c.MaxBatch))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("field Linger must not be negative, got %s", c.Linger))
	}
	return errors.Join(errs...)
}

// BatchConsumer consumes a topic in batches: one transaction for many messages instead of one
// each. See NewBatchConsumer.
type BatchConsumer struct {
	cfg     BatchConfig
	sub     message.Subscriber
	topic   string
	inner   message.HandlerFunc // [tracing →] [order guard →] handler: run inside the batch's transaction
	single  message.HandlerFunc // the per-message stack around the handler
	inbox   *inbox
	metrics *consumerMetrics

	mu      sync.Mutex
	running chan struct{}
	started bool
}

// NewBatchConsumer consumes topic from sub with handler h — the same handler the per-message stack
// runs, such as handlers.JSON(...) — a batch of messages to one transaction: it takes up to
// MaxBatch messages the subscriber has handed out, inserts all their inbox rows in one statement,
// runs h for each new one in arrival order with the batch's transaction (handlers.JSON and
// outboxkit.TxFrom find it as they find the inbox's), writes what h returns into the outbox to
// PublishTopic, commits once and then acknowledges them all. Duplicates are acknowledged without
// running h.
//
// Everything else is the per-message stack's, unchanged, because the batch hands it over: a
// delivery the broker does not vouch is the first (a redelivery, or a broker that does not say)
// runs through the stack on its own, in its place in the order, so it is counted, locked and
// dead-lettered as usual; when anything in a batch fails — a handler's error or panic, a message
// past the dedup window, an order guard's early version, the database — the batch rolls back
// and each of its messages runs through the stack one at a time, so a poison message is
// dead-lettered alone (at once when its error is permanent) while the others commit. A crash before
// the commit leaves no effect of the batch; the broker delivers it again. Per-key order holds: a
// batch's messages are applied in arrival order, and a batch starts when the one before it is
// settled.
//
// A batch can only fill if the subscriber hands out more than one message before the first is
// acknowledged: backends.Options.Unacked set to MaxBatch, on RabbitMQ, NATS JetStream, Redis
// Streams (per subscription) and Kafka (per partition). Such a subscriber says so with a method
// Unacked() int; Run warns when it hands out fewer than MaxBatch, or does not say (Watermill's
// subscribers hand out one at a time: with them every batch holds one message). Batches need first
// deliveries the broker vouches for (outboxkit.WithRedelivered): outboxkit's subscribers of those
// four brokers say which deliveries are first ones. Run it with Run; it needs no router.
func NewBatchConsumer(cfg BatchConfig, sub message.Subscriber, topic string, h message.HandlerFunc) (*BatchConsumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("batch consumer: %w", err)
	}
	if sub == nil || topic == "" || h == nil {
		return nil, errors.New("batch consumer: a subscriber, a topic and a handler are required")
	}
	if err := checkSubscriber(sub, cfg.Consumer); err != nil {
		return nil, fmt.Errorf("batch consumer %q: %w", cfg.Consumer, err)
	}
	stack, err := Stack(cfg.StackConfig)
	if err != nil {
		return nil, fmt.Errorf("batch consumer: %w", err)
	}
	c := &BatchConsumer{cfg: cfg, sub: sub, topic: topic, running: make(chan struct{}),
		inbox: &inbox{cfg: InboxConfig{Store: cfg.Store, Consumer: cfg.Consumer}}}
	c.single = chain(stack, h)
	var inner []message.HandlerMiddleware
	if cfg.TracerProvider != nil {
		t, err := NewTracing(TracingConfig{Consumer: cfg.Consumer, TracerProvider: cfg.TracerProvider})
		if err != nil {
			return nil, fmt.Errorf("batch consumer: %w", err)
		}
		inner = append(inner, t)
	}
	if cfg.OrderGuard != nil {
		og := *cfg.OrderGuard
		og.Store, og.Consumer, og.Now = cfg.Store, cfg.Consumer, cfg.Now
		g, err := NewOrderGuard(og)
		if err != nil {
			return nil, fmt.Errorf("batch consumer: %w", err)
		}
		inner = append(inner, g)
	}
	c.inner = chain(inner, h)
	if cfg.Metrics != nil {
		if c.metrics, err = newConsumerMetrics(MetricsConfig{Consumer: cfg.Consumer, Metrics: cfg.Metrics, Now: cfg.Now, Store: cfg.Store}); err != nil {
			return nil, fmt.Errorf("batch consumer: %w", err)
		}
	}
	return c, nil
}

// NoPublish adapts a handler that returns no messages, such as handlers.JSON(...), to
// NewBatchConsumer.
func NoPublish(h message.NoPublishHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}

// chain wraps h in ms, the first outermost.
func chain(ms []message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	for i := len(ms) - 1; i >= 0; i-- {
		h = ms[i](h)
	}
	return h
}

// Running is closed once Run has subscribed.
func (c *BatchConsumer) Running() <-chan struct{} { return c.running }

// Run subscribes and consumes until ctx ends or the subscription's channel closes, then returns
// nil once the batch in progress is settled. It may be called once. It first checks the store's
// tables and returns at once, saying what to do, when they are missing or newer than this build or
// the database refuses the consumer's credentials; an unreachable database only delays.
func (c *BatchConsumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return errors.New("batch consumer: Run called twice")
	}
	c.started = true
	c.mu.Unlock()
	if err := c.checkSchema(ctx); err != nil {
		return err
	}
	msgs, err := c.sub.Subscribe(ctx, c.topic)
	if err != nil {
		return fmt.Errorf("batch consumer %s: subscribe to %s: %w", c.cfg.Consumer, c.topic, err)
	}
	if c.cfg.MaxBatch > 1 {
		fields := watermill.LogFields{"consumer": c.cfg.Consumer, "topic": c.topic, "max_batch": c.cfg.MaxBatch}
		if u, ok := c.sub.(interface{ Unacked() int }); !ok {
			logs.Warn(c.cfg.Logger, "The subscriber does not say how many messages it hands out at once; "+
				"Watermill's hand out one, and every batch then holds one message", nil, fields)
		} else if n := u.Unacked(); n < c.cfg.MaxBatch {
			logs.Warn(c.cfg.Logger, fmt.Sprintf("The subscriber hands out %d messages at once, so batches hold at most %d: "+
				"set backends.Options.Unacked to MaxBatch (RabbitMQ, NATS JetStream, Redis Streams, Kafka)", n, n), nil, fields)
		}
	}
	close(c.running)
	for {
		batch := c.collect(ctx, msgs)
		if len(batch) == 0 {
			return nil
		}
		c.process(batch)
	}
}

// collect waits for a first message, then takes what else has arrived (waiting up to Linger), up
// to MaxBatch. Empty when the subscription ended.
func (c *BatchConsumer) collect(ctx context.Context, msgs <-chan *message.Message) []*message.Message {
	var batch []*message.Message
	select {
	case m, ok := <-msgs:
		if !ok {
			return nil
		}
		batch = append(batch, m)
	case <-ctx.Done():
		return nil
	}
	var linger <-chan time.Time
	if c.cfg.Linger > 0 {
		t := time.NewTimer(c.cfg.Linger)
		defer t.Stop()
		linger = t.C
	}
	for len(batch) < c.cfg.MaxBatch {
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch
			}
			batch = append(batch, m)
			continue
		default:
		}
		if linger == nil {
			return batch
		}
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		case <-linger:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// process settles a batch in arrival order: runs of broker-vouched first deliveries go through
// one transaction each; any other delivery through the per-message stack, in its place.
func (c *BatchConsumer) process(batch []*message.Message) {
	for _, m := range batch {
		m.SetContext(withSubscribeTopic(m.Context(), c.topic)) // as a router does: dead letters and parked rows name it
	}
	start := 0
	for i, m := range batch {
		if c.batchable(m) {
			continue
		}
		c.commitRun(batch[start:i])
		c.one(m)
		start = i + 1
	}
	c.commitRun(batch[start:])
}

// batchable reports whether a delivery may run in a batch's transaction: one the broker vouches
// is the first, which the per-message stack would not count either.
func (c *BatchConsumer) batchable(m *message.Message) bool {
	if m.UUID == "" || c.cfg.CountFirstDeliveries {
		return false
	}
	redelivered, known := outboxkit.Redelivered(m.Context())
	return known && !redelivered
}

// one runs a delivery through the per-message stack and settles it with the broker. A handler
// that panics is nacked, as a crash would leave it: the redelivery is counted, and dead-lettered
// after MaxDeliveries.
func (c *BatchConsumer) one(m *message.Message) {
	m.SetContext(withPublishTopic(m.Context(), c.cfg.PublishTopic))
	defer func() {
		if r := recover(); r != nil {
			c.cfg.Logger.Error("Handler panicked", fmt.Errorf("%v", r), watermill.LogFields{"consumer": c.cfg.Consumer, "message_uuid": m.UUID})
			m.Nack()
		}
	}()
	if _, err := c.single(m); err != nil {
		m.Nack()
		return
	}
	m.Ack()
}

// commitRun settles a run of batchable deliveries in one transaction, or, when that fails, one at
// a time through the per-message stack.
func (c *BatchConsumer) commitRun(run []*message.Message) {
	if len(run) == 0 {
		return
	}
	contexts := make([]context.Context, len(run))
	for i, m := range run {
		contexts[i] = m.Context()
	}
	start := c.cfg.Now()
	err := c.inTransaction(run)
	if err != nil {
		if len(run) > 1 {
			c.cfg.Logger.Debug("Batch rolled back, settling its messages one at a time", watermill.LogFields{
				"consumer": c.cfg.Consumer, "messages": len(run), "err": err,
			})
		}
		for i, m := range run {
			m.SetContext(contexts[i]) // a fresh delivery: nothing of the batch's attempt
			c.one(m)
		}
		return
	}
	took := c.cfg.Now().Sub(start) / time.Duration(len(run))
	for _, m := range run {
		// Recorded before the ack, as the per-message stack does: whoever sees the ack sees the
		// outcome counted.
		if c.metrics != nil {
			c.metrics.record(m, deliveryOf(m), nil, took)
		}
		m.Ack()
	}
}

// errPastDedupWindow sends a delivery past the dedup window to the per-message stack, which
// dead-letters it as a possible duplicate.
var errPastDedupWindow = errors.New("a message older than the dedup window")

// inTransaction inserts the run's inbox rows, runs the handler for each new message and commits.
// nil: every delivery is settled and may be acknowledged.
func (c *BatchConsumer) inTransaction(run []*message.Message) (err error) {
	ctx := run[0].Context()
	// A batch runs with the process's other deliveries, never beside a suspect running alone.
	hold, err := holdShared(ctx)
	if err != nil {
		return err
	}
	defer hold.release()
	session := c.cfg.Store.Session()
	ids := make([]string, len(run))
	for i, m := range run {
		ids[i] = m.UUID
	}
	now := c.cfg.Now()
	tx, inserted, err := beginInboxes(ctx, session, c.cfg.Consumer, ids, now)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	var duplicates []string
	for _, m := range run {
		d := deliveryOf(m)
		d.count = 1
		if !inserted[m.UUID] {
			d.duplicate = true
			duplicates = append(duplicates, m.UUID)
			continue
		}
		delete(inserted, m.UUID) // a second copy in the same batch is a duplicate
		d.consumer, d.message = c.cfg.Consumer, m.UUID
		if created, ok := outboxkit.CreatedAt(m); ok && now.Sub(created) > c.cfg.DedupWindow {
			return errPastDedupWindow
		}
		if err := c.apply(m, d, tx, hold); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit a batch of %d messages: %w", len(run), err)
	}
	for _, id := range duplicates {
		if err := session.CountDuplicate(ctx, c.cfg.Consumer, id); err != nil {
			c.cfg.Logger.Error("Cannot count a duplicate", err, watermill.LogFields{"consumer": c.cfg.Consumer, "message_uuid": id})
		}
	}
	return nil
}

// beginInboxes begins the batch's transaction with its inbox rows inserted: in one round trip
// where the store can (store.InboxBeginner), else BEGIN and then the INSERT.
func beginInboxes(ctx context.Context, session store.Session, consumer string, ids []string, now time.Time) (store.InboxTx, map[string]bool, error) {
	if b, ok := session.(store.InboxBeginner); ok {
		return b.BeginInboxes(ctx, consumer, ids, now)
	}
	tx, err := session.BeginInbox(ctx)
	if err != nil {
		return nil, nil, err
	}
	inserted, err := tx.InsertInboxes(ctx, consumer, ids, now)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return tx, inserted, nil
}

// apply runs the handler for one message in the batch's transaction and writes what it returns
// into the outbox there.
func (c *BatchConsumer) apply(m *message.Message, d *delivery, tx store.InboxTx, hold *gateHold) (err error) {
	ctx := m.Context()
	d.inbox = tx
	m.SetContext(withPublishTopic(outboxkit.WithTx(hold.bind(ctx), tx.User()), c.cfg.PublishTopic))
	defer func() {
		m.SetContext(ctx)
		d.inbox = nil
		if r := recover(); r != nil {
			err = handlers.Permanent(fmt.Errorf("handler panicked on message %s: %v", m.UUID, r))
		}
	}()
	out, err := c.inner(m)
	if err != nil {
		return err
	}
	return c.inbox.emit(m.Context(), tx, m, out)
}

// checkSchema refuses to start on tables missing or newer than this build, or refused credentials;
// an unreachable database is left to the stack, which holds messages until it answers.
func (c *BatchConsumer) checkSchema(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.cfg.Store.CheckSchema(cctx); err != nil && misconfigured(err) {
		return fmt.Errorf("batch consumer %s: %w", c.cfg.Consumer, err)
	}
	return nil
}
