package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// batchTests are the Batch group: middleware.BatchConsumer's subtests, the crash loop's in
// batch_crash_loop.go.
func batchTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"ManyMessagesOneTransaction", batchOneTransaction[TTx]},
		{"DuplicatesAreAcknowledgedWithoutTheHandler", batchDuplicates[TTx]},
		{"PoisonIsDeadLetteredAloneTheOthersCommit", batchPoison[TTx]},
		{"RedeliveriesGoThroughTheStackInTheirPlace", batchRedeliveries[TTx]},
		{"HandlerOutputGoesIntoTheOutbox", batchOutput[TTx]},
		{"OrderGuardEarlyVersionFallsBack", batchOrderGuard[TTx]},
		{"MisconfiguredIsRefusedAtStart", batchMisconfigured[TTx]},
		{"CrashLoopSuspectRunsAloneInnocentsAreNotDeadLettered", batchCrashLoop[TTx]},
	}
}

// feed is a subscriber that hands out what the test puts in, all at once, and tells how each
// message was settled.
type feed struct {
	ch chan *message.Message
}

func newFeed(msgs ...*message.Message) *feed {
	f := &feed{ch: make(chan *message.Message, len(msgs)+16)}
	for _, m := range msgs {
		f.ch <- m
	}
	return f
}

func (f *feed) Subscribe(context.Context, string) (<-chan *message.Message, error) { return f.ch, nil }
func (f *feed) Close() error                                                       { return nil }

// settled waits for every message's ack or nack and returns the nacked ones' UUIDs.
func settled(t *testing.T, msgs []*message.Message) []string {
	t.Helper()
	var nacked []string
	for _, m := range msgs {
		select {
		case <-m.Acked():
		case <-m.Nacked():
			nacked = append(nacked, m.UUID)
		case <-time.After(20 * time.Second):
			t.Fatalf("message %s neither acked nor nacked", m.UUID)
		}
	}
	return nacked
}

// vouched is a first delivery as outboxkit's subscribers hand it over.
func vouched(m *message.Message) *message.Message {
	m.SetContext(outboxkit.WithRedelivered(context.Background(), false))
	return m
}

// runBatches runs a batch consumer of feed until the test ends.
func (e *consumerEnv[TTx]) runBatches(t *testing.T, f *feed, h message.HandlerFunc, tune ...func(*middleware.BatchConfig)) {
	t.Helper()
	t.Cleanup(e.startBatches(t, "billing", f, h, tune...))
}

// startBatches runs a batch consumer of feed for consumer until stop.
func (e *consumerEnv[TTx]) startBatches(t *testing.T, consumer string, f *feed, h message.HandlerFunc, tune ...func(*middleware.BatchConfig)) (stop func()) {
	t.Helper()
	cfg := middleware.BatchConfig{StackConfig: middleware.StackConfig{
		Store: e.Store, Consumer: consumer, Metrics: prom.NewConsumerMetrics(e.reg), MaxRetries: -1,
		RetryBackoff: outboxkit.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Multiplier: 2},
	}, MaxBatch: 10}
	for _, fn := range tune {
		fn(&cfg)
	}
	c, err := middleware.NewBatchConsumer(cfg, f, "orders", h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	select {
	case <-c.Running():
	case <-time.After(10 * time.Second):
		stop()
		t.Fatal("batch consumer did not start")
	}
	return stop
}

// txRecorder is a handler writing one effects row per message that remembers, per message, the
// transaction it was given and the order it ran in.
type txRecorder[TTx any] struct {
	e    *consumerEnv[TTx]
	mu   sync.Mutex
	txs  map[any]int // transaction → messages handled in it
	runs []string    // message UUIDs in the order the handler ran
	fail func(uuid string) error
}

func (r *txRecorder[TTx]) handler() message.HandlerFunc {
	return middleware.NoPublish(handlers.JSON(func(ctx context.Context, tx TTx, o order) error {
		msg, _ := handlers.MessageFrom(ctx)
		// Inside a batch, as in the per-message stack, the handler gets its outbound key.
		if key, ok := middleware.OutboundKey(ctx); !ok || key != outboxkit.OutboundKey("billing", msg.UUID) {
			return fmt.Errorf("outbound key %q (%v), want the billing key of %s", key, ok, msg.UUID)
		}
		r.mu.Lock()
		if r.txs == nil {
			r.txs = map[any]int{}
		}
		r.txs[any(tx)]++
		r.runs = append(r.runs, msg.UUID)
		r.mu.Unlock()
		if r.fail != nil {
			if err := r.fail(msg.UUID); err != nil {
				return err
			}
		}
		return r.e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.effects (consumer, message_id, note) VALUES ('billing', ?, ?)`, msg.UUID, o.ID)
	}))
}

func (r *txRecorder[TTx]) transactions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.txs)
}

func orderMsgs(n int, prefix string) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = vouched(orderMsg(fmt.Sprintf("%s-%02d", prefix, i)))
	}
	return msgs
}

// 25 first deliveries handed out at once, MaxBatch 10: three transactions, every effect once,
// applied in arrival order, nothing counted in inbox_deliveries (the broker vouched each was the
// first).
func batchOneTransaction[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msgs := orderMsgs(25, "o")
	r := &txRecorder[TTx]{e: e}
	e.runBatches(t, newFeed(msgs...), r.handler())
	if nacked := settled(t, msgs); len(nacked) != 0 {
		t.Fatalf("nacked %v", nacked)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects`); n != 25 {
		t.Fatalf("%d effects, want 25", n)
	}
	if n := r.transactions(); n != 3 {
		t.Fatalf("the 25 messages ran in %d transactions, want 3 (batches of 10, 10 and 5)", n)
	}
	for i, m := range msgs {
		if r.runs[i] != m.UUID {
			t.Fatalf("handler ran %v, want the arrival order", r.runs)
		}
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox WHERE consumer = 'billing'`); n != 25 {
		t.Fatalf("%d inbox rows, want 25", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries`); n != 0 {
		t.Fatalf("%d delivery counts written for vouched first deliveries, want none", n)
	}
	if n := e.outcome(t, "billing", "processed"); n != 25 {
		t.Fatalf("processed metric %d, want 25", n)
	}
}

// A batch holding a message twice and one processed before: the handler runs once per new
// message; every delivery is acknowledged; the duplicates are counted.
func batchDuplicates[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	old := orderMsg("old")
	stack := e.stack(t, "billing", e.effect("billing"))
	if _, err := stack(delivery(old)); err != nil {
		t.Fatal(err)
	}
	a, b := orderMsg("a"), orderMsg("b")
	msgs := []*message.Message{vouched(delivery(a)), vouched(delivery(old)), vouched(delivery(b)), vouched(delivery(a))}
	r := &txRecorder[TTx]{e: e}
	e.runBatches(t, newFeed(msgs...), r.handler())
	if nacked := settled(t, msgs); len(nacked) != 0 {
		t.Fatalf("nacked %v", nacked)
	}
	if len(r.runs) != 2 || r.runs[0] != a.UUID || r.runs[1] != b.UUID {
		t.Fatalf("handler ran for %v, want once for a and once for b", r.runs)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects WHERE consumer = 'billing'`); n != 3 {
		t.Fatalf("%d effects, want 3 (old, a, b)", n)
	}
	if n := e.MustInt(t, `SELECT coalesce(sum(duplicates), 0) FROM {{schema}}.inbox WHERE consumer = 'billing'`); n != 2 {
		t.Fatalf("%d duplicates counted, want 2", n)
	}
	if n := e.outcome(t, "billing", "duplicate"); n != 2 {
		t.Fatalf("duplicate metric %d, want 2", n)
	}
}

// One message of ten fails with a permanent error: the batch rolls back, its messages run one at a
// time, the poison is dead-lettered on its first delivery and the other nine commit.
func batchPoison[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msgs := orderMsgs(10, "p")
	poison := msgs[4].UUID
	r := &txRecorder[TTx]{e: e, fail: func(uuid string) error {
		if uuid == poison {
			return handlers.Permanent(errors.New("invoice total is negative"))
		}
		return nil
	}}
	e.runBatches(t, newFeed(msgs...), r.handler())
	if nacked := settled(t, msgs); len(nacked) != 0 {
		t.Fatalf("nacked %v: the poison must be dead-lettered and acknowledged, the others processed", nacked)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects WHERE message_id <> ?`, poison); n != 9 {
		t.Fatalf("%d effects of the nine good messages, want 9", n)
	}
	if n := e.count(t, "effects", "billing", poison); n != 0 {
		t.Fatal("the poison's effect survived")
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "billing"})
	if len(letters) != 1 || letters[0].MessageID != poison || letters[0].Attempts != 1 || !strings.Contains(letters[0].Reason, "negative") {
		t.Fatalf("dead letters %+v: want the poison alone, on its first delivery, with its reason", letters)
	}
	if letters[0].Topic != "orders" {
		t.Fatalf("dead letter of topic %q, want the batch consumer's topic (a replay sends it there)", letters[0].Topic)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox WHERE consumer = 'billing'`); n != 9 {
		t.Fatalf("%d inbox rows, want 9", n)
	}
}

// A redelivery (or a delivery the broker says nothing of) in the middle of a batch runs through the
// per-message stack, in its place: it is counted; the batch around it is not.
func batchRedeliveries[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msgs := orderMsgs(6, "r")
	redelivered := msgs[2]
	redelivered.SetContext(outboxkit.WithRedelivered(context.Background(), true))
	unknown := msgs[4]
	unknown.SetContext(context.Background())
	r := &txRecorder[TTx]{e: e}
	e.runBatches(t, newFeed(msgs...), r.handler())
	if nacked := settled(t, msgs); len(nacked) != 0 {
		t.Fatalf("nacked %v", nacked)
	}
	for i, m := range msgs {
		if r.runs[i] != m.UUID {
			t.Fatalf("handler ran %v, want the arrival order", r.runs)
		}
	}
	if n := e.deliveries(t, "billing", redelivered.UUID); n != 2 {
		t.Fatalf("the redelivery was counted %d, want 2 (its first delivery was not counted)", n)
	}
	if n := e.deliveries(t, "billing", unknown.UUID); n != 1 {
		t.Fatalf("the unvouched delivery was counted %d, want 1", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries`); n != 2 {
		t.Fatalf("%d delivery counts, want 2: the vouched first deliveries write none", n)
	}
	if n := r.transactions(); n != 5 {
		t.Fatalf("%d transactions, want 5: [0 1], 2 alone, [3], 4 alone, [5]", n)
	}
}

// What the handler returns goes into the outbox in the batch's transaction, to PublishTopic; it
// rolls back with a failed batch and is written once when the message commits on its own.
func batchOutput[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msgs := orderMsgs(5, "i")
	failOnce := msgs[3].UUID
	var failed bool
	var mu sync.Mutex
	handler := func(m *message.Message) ([]*message.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if m.UUID == failOnce && !failed {
			failed = true
			return []*message.Message{pipeline.NewEvent("InvoiceIssued", "inv-"+m.UUID, nil)}, errTransient
		}
		return []*message.Message{pipeline.NewEvent("InvoiceIssued", "inv-"+m.UUID, nil)}, nil
	}
	e.runBatches(t, newFeed(msgs...), handler, func(c *middleware.BatchConfig) {
		c.PublishTopic = "invoices"
		c.MaxRetries = 1
	})
	if nacked := settled(t, msgs); len(nacked) != 0 {
		t.Fatalf("nacked %v", nacked)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE topic = 'invoices'`); n != 5 {
		t.Fatalf("%d invoices in the outbox, want one per order: 5", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE partition_key = ?`, "inv-"+failOnce); n != 1 {
		t.Fatalf("%d invoices for the message that failed once, want 1", n)
	}
}

// An order guard's early version is parked in the batch's transaction like any other, and applied
// there when its predecessor comes later in the same batch.
func batchOrderGuard[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	v1, v2, v3, w2 := vouched(versioned("acct-1", 1)), vouched(versioned("acct-1", 2)), vouched(versioned("acct-1", 3)), vouched(versioned("acct-2", 2))
	r := &txRecorder[TTx]{e: e}
	e.runBatches(t, newFeed(v3, v1, w2, v2), r.handler(), func(c *middleware.BatchConfig) {
		c.OrderGuard = &middleware.OrderGuardConfig{FirstVersion: 1}
	})
	if nacked := settled(t, []*message.Message{v3, v1, w2, v2}); len(nacked) != 0 {
		t.Fatalf("nacked %v, want none (early versions are parked, not nacked)", nacked)
	}
	for _, m := range []*message.Message{v1, v2, v3} {
		if n := e.count(t, "effects", "billing", m.UUID); n != 1 {
			t.Fatalf("acct-1 version %s applied %d times, want once", m.Metadata.Get(outboxkit.MetadataVersion), n)
		}
	}
	if n := e.count(t, "effects", "billing", w2.UUID); n != 0 {
		t.Fatal("acct-2 version 2 was applied before its version 1")
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_parked WHERE consumer = 'billing'`); n != 1 {
		t.Fatalf("%d parked, want acct-2 version 2 alone", n)
	}
}

// namedFeed is a feed whose subscriber reads for a consumer, as outboxkit's subscribers say.
type namedFeed struct {
	*feed
	consumer string
}

func (f namedFeed) Consumer() string { return f.consumer }

// A batch consumer refuses, when it is built, a subscriber of another consumer than its own; and
// its Run refuses tables never migrated, saying which version to migrate to.
func batchMisconfigured[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	env := h.Open(t) // not migrated
	cfg := middleware.BatchConfig{StackConfig: middleware.StackConfig{Store: env.Store, Consumer: "billing"}}
	handler := middleware.NoPublish(func(*message.Message) error { return nil })
	_, err := middleware.NewBatchConsumer(cfg, namedFeed{newFeed(), "shipping"}, "orders", handler)
	if !errors.Is(err, middleware.ErrWrongConsumer) || !strings.Contains(err.Error(), `"shipping"`) {
		t.Fatalf("a subscriber of another consumer: %v; want ErrWrongConsumer naming it", err)
	}
	c, err := middleware.NewBatchConsumer(cfg, namedFeed{newFeed(), "billing"}, "orders", handler)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Run(ctx); !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "needs version") {
		t.Fatalf("Run on tables never migrated: %v; want ErrNotMigrated naming the version", err)
	}
}
