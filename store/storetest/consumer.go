package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

func consumerTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"InboxFailedEffectLeavesNothingAndTheRetrySucceeds", inboxFailedEffect[TTx]},
		{"InboxFiftyConcurrentDeliveries", inboxFiftyConcurrent[TTx]},
		{"InboxTwoConsumersEachProcessOnce", inboxTwoConsumers[TTx]},
		{"InboxOlderThanRetentionIsDeadLetteredAsPossibleDuplicate", inboxOlderThanRetention[TTx]},
		{"InboxHandlerOutputGoesIntoTheOutbox", inboxHandlerOutput[TTx]},
		{"InboxHandlerOutputWithoutPublishTopicIsRefused", inboxHandlerOutputWithoutTopic[TTx]},
		{"PruneInboxRemovesOnlyRowsOlderThanTheCutoff", pruneInbox[TTx]},
		{"StatsCountProcessedDuplicatesAndDeadLetters", consumerStats[TTx]},
		{"DeadLettersWaitingAreGaugesReadAtScrapeTime", deadLettersWaiting[TTx]},
		{"OutboundKeyIsStableAcrossDeliveriesAndPerConsumer", outboundKeyStable[TTx]},
		{"DeliveryCountBrokerVouchedFirstDelivery", deliveryCountVouched[TTx]},
		{"DeadLetterUndecodablePayloadIsDeadLetteredAtOnce", deadLetterUndecodable[TTx]},
		{"DeadLetterTransientFailureIsDeadLetteredAfterMaxDeliveries", deadLetterTransient[TTx]},
		{"DeadLetterCrashLoopDeadLettersOnlyTheCrasher", deadLetterCrashLoop[TTx]},
		{"DeadLetterSuspectPastSoloWaitIsNotRunAndTriedAgain", deadLetterSoloWaitTimeout[TTx]},
		{"DeadLetterPoisonTopicThroughWatermillsPoisonQueue", deadLetterPoisonTopic[TTx]},
		{"ReplayProcessedOnceThenDuplicate", replayOnceThenDuplicate[TTx]},
		{"OrderGuard", orderGuard[TTx]},
		{"OutageNeitherCountsNorDeadLetters", outageNeitherCounts[TTx]},
		{"MessageWithoutIDIsDeadLetteredApart", messageWithoutID[TTx]},
		{"MisconfiguredTxTypeIsHeldNotDeadLettered", misconfiguredTxType[TTx]},
		{"MisconfiguredConsumerIsHeldNotRecorded", misconfiguredConsumer[TTx]},
		{"MisconfiguredNotMigratedIsHeldAndNamesTheVersion", misconfiguredNotMigrated[TTx]},
	}
}

// consumerEnv is a migrated store with an effects table and a metrics registry.
type consumerEnv[TTx any] struct {
	*Env[TTx]
	reg *prometheus.Registry
	now func() time.Time
}

func newConsumerEnv[TTx any](t *testing.T, h Harness[TTx]) *consumerEnv[TTx] {
	t.Helper()
	e := &consumerEnv[TTx]{Env: migrated(t, h), reg: prometheus.NewRegistry(), now: time.Now}
	e.MustExec(t, `CREATE TABLE {{schema}}.effects (consumer VARCHAR(100) NOT NULL, message_id VARCHAR(255) NOT NULL, note VARCHAR(255))`)
	return e
}

// order is the event the test handlers consume.
type order struct {
	ID string `json:"id"`
}

// effect is a typed handler writing one effects row through the inbox transaction.
func (e *consumerEnv[TTx]) effect(consumer string) message.NoPublishHandlerFunc {
	return handlers.JSON(func(ctx context.Context, tx TTx, o order) error {
		msg, _ := handlers.MessageFrom(ctx)
		return e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.effects (consumer, message_id, note) VALUES (?, ?, ?)`, consumer, msg.UUID, o.ID)
	})
}

// stack wraps h in the recommended stack for consumer, with fast retries.
func (e *consumerEnv[TTx]) stack(t *testing.T, consumer string, h message.NoPublishHandlerFunc, tune ...func(*middleware.StackConfig)) message.HandlerFunc {
	t.Helper()
	cfg := middleware.StackConfig{
		Store: e.Store, Consumer: consumer, Metrics: prom.NewConsumerMetrics(e.reg), Now: e.now,
		RetryBackoff: outboxkit.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Multiplier: 2},
	}
	for _, fn := range tune {
		fn(&cfg)
	}
	ms, err := middleware.Stack(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handler message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
	for i := len(ms) - 1; i >= 0; i-- {
		handler = ms[i](handler)
	}
	return handler
}

// delivery is a fresh copy of msg, as a broker hands over each (re)delivery.
func delivery(msg *message.Message) *message.Message {
	c := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		c.Metadata.Set(k, v)
	}
	return c
}

// brokerDelivery is a fresh copy of msg carrying what a broker says of the delivery, as
// outboxkit's RabbitMQ, NATS, Redis and Kafka subscribers set it.
func brokerDelivery(msg *message.Message, redelivered bool) *message.Message {
	c := delivery(msg)
	c.SetContext(outboxkit.WithRedelivered(context.Background(), redelivered))
	return c
}

var msgSeq atomic.Int64

func orderMsg(id string) *message.Message {
	return message.NewMessage(fmt.Sprintf("msg-%s-%d-%d", id, time.Now().UnixNano(), msgSeq.Add(1)), []byte(fmt.Sprintf(`{"id":%q}`, id)))
}

func (e *consumerEnv[TTx]) count(t *testing.T, table, consumer, uuid string) int {
	t.Helper()
	return e.MustInt(t, `SELECT count(*) FROM {{schema}}.`+table+` WHERE consumer = ? AND message_id = ?`, consumer, uuid)
}

func (e *consumerEnv[TTx]) deliveries(t *testing.T, consumer, uuid string) int {
	t.Helper()
	return e.MustInt(t, `SELECT coalesce(max(deliveries), 0) FROM {{schema}}.inbox_deliveries WHERE consumer = ? AND message_id = ?`, consumer, uuid)
}

// outcome reads outboxkit_consumer_messages_total for consumer and outcome.
func (e *consumerEnv[TTx]) outcome(t *testing.T, consumer, outcome string) int {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "outboxkit_consumer_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == consumer && labels["outcome"] == outcome {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}

func (e *consumerEnv[TTx]) deadLetters(t *testing.T, f store.DeadLetterFilter) []store.DeadLetter {
	t.Helper()
	letters, err := e.Store.InboxDeadLetters(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return letters
}

// assertGoodMessagesFlow processes n good messages through the same stack, each exactly once.
func (e *consumerEnv[TTx]) assertGoodMessagesFlow(t *testing.T, stack message.HandlerFunc, n int) {
	t.Helper()
	before := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects`)
	for i := 0; i < n; i++ {
		if _, err := stack(delivery(orderMsg("good"))); err != nil {
			t.Fatalf("good message %d failed: %v", i, err)
		}
	}
	if got := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects`) - before; got != n {
		t.Fatalf("%d of %d good messages processed", got, n)
	}
}

// redeliverUntilAcked plays the broker: the message is delivered again for as long as the stack
// returns an error, at most max times. It returns how many deliveries it took.
func redeliverUntilAcked(t *testing.T, stack message.HandlerFunc, msg *message.Message, max int) int {
	t.Helper()
	for n := 1; n <= max; n++ {
		if _, err := stack(delivery(msg)); err == nil {
			return n
		}
	}
	t.Fatalf("message %s still nacked after %d deliveries", msg.UUID, max)
	return 0
}

var errTransient = errors.New("downstream service unavailable")

// fastPaths runs a dedup test with the inbox's fast-path read on and off: the read must only be
// an optimisation.
var fastPaths = []struct {
	name    string
	disable bool
}{{"fast path on", false}, {"fast path off", true}}

// The effect's second write fails once: after the failure there is no effect and no inbox row; the
// retry succeeds; in the end there is exactly one of each.
func inboxFailedEffect[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumerEnv(t, h)
			msg := orderMsg("o-1")
			var attempts atomic.Int32
			var afterFailure [2]int
			hf := handlers.JSON(func(ctx context.Context, tx TTx, o order) error {
				n := attempts.Add(1)
				if n == 2 { // look from outside the transaction at what the failed attempt left
					afterFailure[0] = e.count(t, "effects", "shipping", msg.UUID)
					afterFailure[1] = e.count(t, "inbox", "shipping", msg.UUID)
				}
				if err := e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.effects (consumer, message_id, note) VALUES ('shipping', ?, ?)`, msg.UUID, o.ID); err != nil {
					return err
				}
				if n == 1 {
					return e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.no_such_table (x) VALUES (1)`) // the effect's second write fails
				}
				return nil
			})
			stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable })
			if _, err := stack(delivery(msg)); err != nil {
				t.Fatalf("delivery failed: %v (the in-process retry should have succeeded)", err)
			}
			if attempts.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2 (one failure, one retry)", attempts.Load())
			}
			if afterFailure != [2]int{0, 0} {
				t.Fatalf("after the failed attempt: %d effects and %d inbox rows, want none", afterFailure[0], afterFailure[1])
			}
			if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
				t.Fatalf("in the end: %d effects and %d inbox rows, want one of each", got[0], got[1])
			}
		})
	}
}

// One message delivered 50 times at once — redeliveries, serialized by the message lock, and
// first deliveries the broker vouches for, which take no lock and meet on the inbox row: one
// effect, one inbox row, 49 duplicates.
//
// The first delivery holds its transaction until every delivery has begun. It holds a session per
// delivery, so the cases run one after the other and take no more sessions than the database can
// spare beside other tests (at least 20).
func inboxFiftyConcurrent[TTx any](t *testing.T, h Harness[TTx]) {
	n := h.sessions(t, 50)
	if n < 20 {
		t.Fatalf("only %d sessions to spare; the test needs 20", n)
	}
	for _, path := range []string{"redeliveries (locked)", "vouched first deliveries (no lock)"} {
		for _, fp := range fastPaths {
			t.Run(path+", "+fp.name, func(t *testing.T) {
				e := newConsumerEnv(t, h)
				msg := orderMsg("o-1")
				var runs, entered atomic.Int32
				hf := func(m *message.Message) error {
					if runs.Add(1) == 1 && !waitFor(20*time.Second, func() bool { return entered.Load() == int32(n) }) {
						return errors.New("the other deliveries never began")
					}
					return e.effect("shipping")(m)
				}
				stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable; c.MaxRetries = -1 })
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						d := delivery(msg)
						if path != "redeliveries (locked)" {
							d = brokerDelivery(msg, false)
						}
						entered.Add(1)
						if _, err := stack(d); err != nil {
							errs <- err
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("a delivery failed: %v", err)
				}
				if runs.Load() != 1 {
					t.Fatalf("handler ran %d times, want once", runs.Load())
				}
				if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
					t.Fatalf("%d effects and %d inbox rows, want one of each", got[0], got[1])
				}
				if d := e.outcome(t, "shipping", "duplicate"); d != n-1 {
					t.Fatalf("%d duplicates counted, want %d", d, n-1)
				}
			})
		}
	}
}

// Two consumers of the same message each process it once, each with its own inbox row.
func inboxTwoConsumers[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumerEnv(t, h)
			msg := orderMsg("o-1")
			tune := func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable }
			shipping := e.stack(t, "shipping", e.effect("shipping"), tune)
			billing := e.stack(t, "billing", e.effect("billing"), tune)
			for i := 0; i < 3; i++ { // each consumer gets the message three times
				for _, s := range []message.HandlerFunc{shipping, billing} {
					if _, err := s(delivery(msg)); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, c := range []string{"shipping", "billing"} {
				if got := [2]int{e.count(t, "effects", c, msg.UUID), e.count(t, "inbox", c, msg.UUID)}; got != [2]int{1, 1} {
					t.Fatalf("%s: %d effects and %d inbox rows, want one of each", c, got[0], got[1])
				}
				if d := e.outcome(t, c, "duplicate"); d != 2 {
					t.Fatalf("%s: %d duplicates, want 2", c, d)
				}
			}
		})
	}
}

// A message written longer ago than the inbox retention, with no inbox row, may be a redelivery
// whose row was pruned: it is dead-lettered, not processed as new.
func inboxOlderThanRetention[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msg := orderMsg("o-1")
	msg.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-8*24*time.Hour).Format(time.RFC3339Nano))
	stack := e.stack(t, "shipping", e.effect("shipping"))
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatalf("dead-letter should acknowledge: %v", err)
	}
	if e.count(t, "effects", "shipping", msg.UUID) != 0 || e.count(t, "inbox", "shipping", msg.UUID) != 0 {
		t.Fatal("an old message without an inbox row was processed as new")
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{All: true})
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "possible duplicate") {
		t.Fatalf("dead letters = %+v; want one possible duplicate", letters)
	}
	fresh := orderMsg("o-2")
	fresh.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-time.Hour).Format(time.RFC3339Nano))
	if _, err := stack(delivery(fresh)); err != nil || e.count(t, "effects", "shipping", fresh.UUID) != 1 {
		t.Fatalf("a message within the retention was not processed: %v", err)
	}
}

// What a handler returns goes into the outbox, in the inbox's transaction, to the handler's
// publish topic; the router itself publishes nothing. A handler that fails after returning
// messages leaves no outbox row; outside a router that knows a publish topic, returned messages
// are refused with what to do.
func inboxHandlerOutput[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	direct, err := bus.Subscribe(context.Background(), "invoices")
	if err != nil {
		t.Fatal(err)
	}
	stack, err := middleware.Stack(middleware.StackConfig{Store: e.Store, Consumer: "billing", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Each delivery's outcome, once the whole stack has returned (the inbox committed or rolled back).
	type outcome struct {
		uuid string
		err  error
	}
	outcomes := make(chan outcome, 10)
	hr := router.AddHandler("billing", "orders", bus, "invoices", bus, func(msg *message.Message) ([]*message.Message, error) {
		invoice := pipeline.NewEvent("InvoiceIssued", "inv-"+msg.UUID, []byte(`{}`))
		if string(msg.Payload) == `"fail after emitting"` {
			return []*message.Message{invoice}, handlers.Permanent(errors.New("the effect failed"))
		}
		return []*message.Message{invoice}, nil
	})
	hr.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			outcomes <- outcome{msg.UUID, err}
			return out, err
		}
	})
	hr.AddMiddleware(stack...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-router.Running()
	ok, bad := message.NewMessage("m-ok", []byte(`{}`)), message.NewMessage("m-bad", []byte(`"fail after emitting"`))
	for _, m := range []*message.Message{ok, bad} {
		if err := bus.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		for settled := false; !settled; { // acknowledged: processed, or dead-lettered (DeadLetter acks)
			select {
			case o := <-outcomes:
				if o.err != nil {
					t.Logf("delivery of %s failed (%v); the broker delivers it again", o.uuid, o.err)
				}
				settled = o.uuid == m.UUID && o.err == nil
			case <-time.After(10 * time.Second):
				t.Fatalf("message %s was not handled", m.UUID)
			}
		}
	}
	if !waitFor(10*time.Second, func() bool { return e.count(t, "dead_letters", "billing", "m-bad") == 1 }) {
		t.Fatal("the failing message was not dead-lettered")
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE topic = 'invoices' AND partition_key = 'inv-m-ok'`); n != 1 {
		t.Fatalf("%d outbox rows for the returned message, want 1", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
		t.Fatalf("%d outbox rows in all, want 1: a failed handler's output must roll back with its effect", n)
	}
	select {
	case m := <-direct:
		t.Fatalf("the router published %s itself; it must go through the outbox only", m.UUID)
	default:
	}

	// Without a router's publish topic.
	var plain message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{pipeline.NewEvent("X", "k", nil)}, nil
	}
	for i := len(stack) - 1; i >= 0; i-- {
		plain = stack[i](plain)
	}
	msg := orderMsg("o-1")
	if _, err := plain(delivery(msg)); err == nil || !strings.Contains(err.Error(), "publish topic") {
		t.Fatalf("err = %v, want one naming the missing publish topic", err)
	}
	if e.count(t, "inbox", "billing", msg.UUID) != 0 {
		t.Fatal("the refused delivery was committed")
	}
}

func inboxHandlerOutputWithoutTopic[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	ms, err := middleware.Stack(middleware.StackConfig{Store: e.Store, Consumer: "billing", MaxRetries: -1, Metrics: prom.NewConsumerMetrics(e.reg)})
	if err != nil {
		t.Fatal(err)
	}
	var handler message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{pipeline.NewEvent("X", "k", nil)}, nil
	}
	for i := len(ms) - 1; i >= 0; i-- {
		handler = ms[i](handler)
	}
	msg := orderMsg("o-1")
	_, err = handler(delivery(msg))
	if err == nil || !strings.Contains(err.Error(), "publish topic") {
		t.Fatalf("err = %v, want one naming the missing publish topic", err)
	}
	if e.count(t, "inbox", "billing", msg.UUID) != 0 || e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`) != 0 {
		t.Fatal("something was committed")
	}
}

func pruneInbox[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var mu sync.Mutex
	now := time.Now()
	e.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	stack := e.stack(t, "shipping", e.effect("shipping"))
	var old, recent []string
	for i := 0; i < 25; i++ {
		m := orderMsg("old")
		old = append(old, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(48 * time.Hour)
	for i := 0; i < 5; i++ {
		m := orderMsg("recent")
		recent = append(recent, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(time.Hour)
	n, err := middleware.PruneInbox(context.Background(), middleware.PruneConfig{Store: e.Store, BatchSize: 7, Now: e.now}, 24*time.Hour)
	if err != nil || n != 25 {
		t.Fatalf("pruned %d rows (%v), want the 25 older than a day", n, err)
	}
	for _, id := range recent {
		if e.count(t, "inbox", "shipping", id) != 1 {
			t.Fatalf("recent inbox row %s was pruned", id)
		}
	}
	for _, id := range old {
		if e.count(t, "inbox", "shipping", id) != 0 {
			t.Fatalf("old inbox row %s survived", id)
		}
	}
}

func consumerStats[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"))
	a, b := orderMsg("a"), orderMsg("b")
	for _, m := range []*message.Message{a, a, a, b, message.NewMessage("bad", []byte("not json"))} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	stats, err := middleware.Stats(context.Background(), e.Store)
	if err != nil {
		t.Fatal(err)
	}
	want := store.ConsumerStats{Consumer: "shipping", Processed: 2, Duplicates: 2, DeadLetters: 1}
	if len(stats) != 1 || stats[0] != want {
		t.Fatalf("stats = %+v, want %+v", stats, want)
	}
}

// The dead letters that wait for a replay are gauges read from the store at each scrape, per
// consumer on one registry: a replay takes them down, nothing else does (the dead-letter counter's
// rate forgets them within its window while they still wait).
func deadLettersWaiting[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	clock := time.Now()
	e.now = func() time.Time { return clock }
	shipping := e.stack(t, "shipping", e.effect("shipping"))
	billing := e.stack(t, "billing", e.effect("billing"))
	for _, m := range []*message.Message{message.NewMessage("bad-1", []byte("not json")), message.NewMessage("bad-2", []byte("{")), orderMsg("ok")} {
		if _, err := shipping(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := billing(delivery(orderMsg("fine"))); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(90 * time.Second)
	gauge := func(name, consumer string) (float64, bool) {
		t.Helper()
		families, err := e.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range families {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "consumer" && l.GetValue() == consumer {
						return m.GetGauge().GetValue(), true
					}
				}
			}
		}
		return 0, false
	}
	expect := func(consumer string, count float64, minAge, maxAge float64) {
		t.Helper()
		n, ok := gauge("outboxkit_consumer_dead_letters_waiting", consumer)
		age, ok2 := gauge("outboxkit_consumer_oldest_dead_letter_age_seconds", consumer)
		if !ok || !ok2 || n != count || age < minAge || age > maxAge {
			t.Fatalf("%s: waiting %v (exported %v), oldest age %vs (exported %v); want %v waiting, age in [%v, %v]",
				consumer, n, ok, age, ok2, count, minAge, maxAge)
		}
	}
	expect("shipping", 2, 60, 120) // dead-lettered about 90s before the scrape's clock
	expect("billing", 0, 0, 0)

	letters, err := e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping"})
	if err != nil || len(letters) != 2 {
		t.Fatalf("dead letters %v, %v", letters, err)
	}
	if err := e.Store.MarkReplayed(context.Background(), letters[0].ID, clock); err != nil {
		t.Fatal(err)
	}
	expect("shipping", 1, 60, 120)
	if err := e.Store.MarkReplayed(context.Background(), letters[1].ID, clock); err != nil {
		t.Fatal(err)
	}
	expect("shipping", 0, 0, 0)
}

// The handler's outbound idempotency key is the same on every delivery of a message (a failed
// attempt and its redelivery) and differs between consumers; outside an inbox there is none.
func outboundKeyStable[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var keys []string
	failOnce := true
	record := func(consumer string) message.NoPublishHandlerFunc {
		return func(m *message.Message) error {
			k, ok := middleware.OutboundKey(m.Context())
			if !ok {
				return errors.New("no outbound key inside the stack")
			}
			keys = append(keys, consumer+" "+k)
			if consumer == "billing" && failOnce {
				failOnce = false
				return errTransient // rolled back: the call would be made again on the redelivery
			}
			return e.effect(consumer)(m)
		}
	}
	billing := e.stack(t, "billing", record("billing"), func(c *middleware.StackConfig) { c.MaxRetries = -1 })
	shipping := e.stack(t, "shipping", record("shipping"))
	msg := orderMsg("o-1")
	if _, err := billing(delivery(msg)); !errors.Is(err, errTransient) {
		t.Fatalf("first delivery: %v", err)
	}
	for _, run := range []message.HandlerFunc{billing, shipping} {
		if _, err := run(delivery(msg)); err != nil {
			t.Fatal(err)
		}
	}
	b, s := outboxkit.OutboundKey("billing", msg.UUID), outboxkit.OutboundKey("shipping", msg.UUID)
	want := []string{"billing " + b, "billing " + b, "shipping " + s}
	if !slices.Equal(keys, want) || b == s {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	if _, ok := middleware.OutboundKey(msg.Context()); ok {
		t.Fatal("an outbound key outside the stack")
	}
}

func deliveryCountVouched[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var seen []int // Deliveries(ctx) as each handler call saw it
	fail := map[string]bool{}
	hf := func(m *message.Message) error {
		seen = append(seen, middleware.Deliveries(m.Context()))
		if fail[m.UUID] {
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = -1 })

	msg := orderMsg("ok") // a first delivery that succeeds writes no count
	if _, err := stack(brokerDelivery(msg, false)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 0 || len(seen) != 1 || seen[0] != 1 {
		t.Fatalf("count row %d, handler saw %v; want no row and one delivery seen as 1", n, seen)
	}
	if e.count(t, "inbox", "shipping", msg.UUID) != 1 || e.count(t, "effects", "shipping", msg.UUID) != 1 {
		t.Fatal("want one inbox row and one effect")
	}

	msg = orderMsg("flaky") // a failed first delivery is counted with its error, the redelivery counts on
	fail[msg.UUID] = true
	seen = nil
	if _, err := stack(brokerDelivery(msg, false)); err == nil {
		t.Fatal("want the handler's error")
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 1 ||
		e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id = ? AND last_error LIKE ?`, msg.UUID, "%"+errTransient.Error()+"%") != 1 {
		t.Fatalf("after a failed first delivery: count %d, or the error is not recorded", n)
	}
	delete(fail, msg.UUID)
	if _, err := stack(brokerDelivery(msg, true)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 2 || len(seen) != 2 || seen[1] != 2 {
		t.Fatalf("after the redelivery: count %d, handler saw %v; want 2 and [1 2]", n, seen)
	}

	msg = orderMsg("killer") // a first delivery that killed the process counts when the broker redelivers
	fail[msg.UUID] = true
	seen = nil
	if _, err := stack(brokerDelivery(msg, true)); err == nil {
		t.Fatal("want the handler's error: nacked for another delivery")
	}
	if _, err := stack(brokerDelivery(msg, true)); err != nil {
		t.Fatalf("third delivery: %v, want it dead-lettered and acked", err)
	}
	if len(seen) != 2 || seen[0] != 2 || seen[1] != 3 {
		t.Fatalf("redeliveries seen as %v, want [2 3]", seen)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{msg.UUID}}); len(letters) != 1 || letters[0].Attempts != 3 {
		t.Fatalf("dead letters %+v: want the message dead-lettered on its third delivery", letters)
	}

	msg = orderMsg("unknown") // without the broker's word every delivery is counted
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n != 1 {
		t.Fatalf("count %d, want 1", n)
	}

	all := e.stack(t, "billing", e.effect("billing"), func(c *middleware.StackConfig) { c.CountFirstDeliveries = true })
	msg = orderMsg("counted")
	if _, err := all(brokerDelivery(msg, false)); err != nil {
		t.Fatal(err)
	}
	if n := e.deliveries(t, "billing", msg.UUID); n != 1 {
		t.Fatalf("CountFirstDeliveries: count %d, want 1", n)
	}
}

func deadLetterUndecodable[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var handled atomic.Int32
	hf := func(m *message.Message) error { handled.Add(1); return e.effect("shipping")(m) }
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3 })
	poison := message.NewMessage("poison-1", []byte("not json"))
	if n := redeliverUntilAcked(t, stack, poison, 10); n != 1 {
		t.Fatalf("the poison took %d deliveries; a permanent error must be dead-lettered on the first", n)
	}
	if handled.Load() != 1 {
		t.Fatalf("the handler ran %d times; a permanent error must not be retried", handled.Load())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})
	if len(letters) != 1 || letters[0].MessageID != "poison-1" || string(letters[0].Payload) != "not json" ||
		!strings.Contains(letters[0].Reason, "decode") || letters[0].Attempts != 1 {
		t.Fatalf("dead letters = %+v; want the poison as received, with the decode error", letters)
	}
	e.assertGoodMessagesFlow(t, stack, 100)
}

func deadLetterTransient[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var attempts atomic.Int32
	failing := "always-failing"
	hf := func(m *message.Message) error {
		if m.UUID == failing {
			attempts.Add(1)
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 3; c.MaxRetries = 2 })
	msg := message.NewMessage(failing, []byte(`{"id":"o-1"}`))
	if n := redeliverUntilAcked(t, stack, msg, 10); n != 3 {
		t.Fatalf("dead-lettered after %d deliveries, want exactly MaxDeliveries = 3", n)
	}
	if attempts.Load() != 9 {
		t.Fatalf("handler ran %d times, want 3 deliveries × (1 + 2 retries) = 9", attempts.Load())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{failing}})
	if len(letters) != 1 || letters[0].Attempts != 3 || !strings.Contains(letters[0].Reason, errTransient.Error()) {
		t.Fatalf("dead letters = %+v", letters)
	}
	e.assertGoodMessagesFlow(t, stack, 100)
}

// errCrash stands for the death of a consumer process: a handler panics with it, and every
// delivery the "process" had in flight ends unsettled with it.
var errCrash = errors.New("the consumer process died")

// suspects is held by the tests with a suspect of crashing the process, which waits to run alone
// in it — the whole test binary, as the gate is process-wide — while their other deliveries wait
// for the process to die: two of them at once would each wait for the other's deliveries, which
// wait behind the other's suspect, until SoloWait ran out.
var suspects sync.Mutex

// A process handling several messages at once (backends.Options.Unacked > 1, prefetch) that one of
// them crashes, again and again, takes the others in flight with it at each exit, and each exit
// counts a delivery of every one of them. Only the crasher is dead-lettered — after its attempt
// alone in the process, on delivery MaxDeliveries + 2 — and the others are processed once each.
// Not parallel: the attempt alone holds the gate of the whole process.
func deadLetterCrashLoop[TTx any](t *testing.T, h Harness[TTx]) {
	suspects.Lock()
	defer suspects.Unlock()
	e := newConsumerEnv(t, h)
	if strings.HasPrefix(e.Store.Info().Name, "sqlite") {
		t.Skip("SQLite runs one inbox transaction at a time: the deliveries in flight cannot all be in their handlers when the process dies")
	}
	const maxDeliveries, bystanders = 2, 2
	crasher := orderMsg("crasher")
	pending := map[string]*message.Message{crasher.UUID: crasher}
	for i := range bystanders {
		m := orderMsg(fmt.Sprintf("bystander-%d", i))
		pending[m.UUID] = m
	}
	// process is one life of the consumer process.
	type process struct {
		ctx     context.Context
		die     context.CancelFunc
		suspect bool          // every message in it is past MaxDeliveries
		started chan struct{} // a bystander's handler is running
	}
	var current atomic.Pointer[process]
	hf := func(m *message.Message) error {
		p := current.Load()
		switch {
		case m.UUID == crasher.UUID:
			if !p.suspect {
				for range bystanders { // the others are in flight when it crashes the process
					<-p.started
				}
			}
			p.die()
			panic(errCrash)
		case !p.suspect:
			p.started <- struct{}{}
			<-p.ctx.Done() // in flight until the process dies
			panic(errCrash)
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) {
		c.MaxDeliveries = maxDeliveries
		c.MaxRetries = -1
		c.SoloWait = 30 * time.Second
	})
	for life := 1; len(pending) > 0; life++ {
		if life > maxDeliveries+3 {
			t.Fatalf("%d messages still unsettled after %d lives of the process", len(pending), life-1)
		}
		ctx, die := context.WithCancel(context.Background())
		p := &process{ctx: ctx, die: die, suspect: life > maxDeliveries, started: make(chan struct{}, bystanders)}
		current.Store(p)
		var (
			mu      sync.Mutex
			settled []string
			wg      sync.WaitGroup
		)
		for _, msg := range pending { // every unacknowledged message is delivered again
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if r := recover(); r != nil && r != errCrash {
						panic(r)
					}
				}()
				m := delivery(msg)
				m.SetContext(ctx)
				if _, err := stack(m); err == nil {
					mu.Lock()
					settled = append(settled, msg.UUID)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		die()
		for _, id := range settled {
			delete(pending, id)
		}
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})
	if len(letters) != 1 || letters[0].MessageID != crasher.UUID {
		t.Fatalf("dead letters = %+v; want the crasher's alone", letters)
	}
	if got := letters[0]; got.Attempts != maxDeliveries+2 || !strings.Contains(got.Reason, "alone in the process") {
		t.Fatalf("crasher dead-lettered after %d deliveries (%q), want MaxDeliveries + 2 = %d, after its attempt alone",
			got.Attempts, got.Reason, maxDeliveries+2)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects WHERE consumer = ?`, "shipping"); n != bystanders {
		t.Fatalf("%d effects, want each of the %d bystanders once", n, bystanders)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of attempts alone left behind", n)
	}
	e.assertGoodMessagesFlow(t, stack, 10)
}

// crashOnce delivers msg through stack once with a handler that crashes the process: the delivery
// is counted and never settled.
func crashOnce(t *testing.T, stack message.HandlerFunc, msg *message.Message) {
	t.Helper()
	defer func() {
		if r := recover(); r != errCrash {
			t.Fatalf("the delivery ended with %v, want the crash", r)
		}
	}()
	_, err := stack(delivery(msg))
	t.Fatalf("the delivery returned %v; the handler was to crash", err)
}

// A suspect waits at most SoloWait for the deliveries in progress to end. Past it, it is neither
// run beside them — were it the crasher, it would take them down again — nor dead-lettered, since
// nothing has shown that it crashes the process: the delivery fails, the broker delivers it again,
// and nothing of an attempt alone is recorded, so the redelivery still gets its attempt alone.
// Not parallel: the suspect waits for the deliveries of the whole process.
func deadLetterSoloWaitTimeout[TTx any](t *testing.T, h Harness[TTx]) {
	suspects.Lock()
	defer suspects.Unlock()
	e := newConsumerEnv(t, h)
	if strings.HasPrefix(e.Store.Info().Name, "sqlite") {
		t.Skip("SQLite runs one inbox transaction at a time: the suspect cannot be counted while the long delivery runs")
	}
	const maxDeliveries = 1
	var (
		crash   atomic.Bool
		runs    atomic.Int32 // the suspect's handler calls
		alone   atomic.Int32 // Deliveries the suspect's handler saw, when it ran
		started = make(chan struct{})
		finish  = make(chan struct{})
	)
	suspect := orderMsg("suspect")
	billing := func(m *message.Message) error {
		runs.Add(1)
		if crash.Load() {
			panic(errCrash)
		}
		alone.Store(int32(middleware.Deliveries(m.Context())))
		return e.effect("billing")(m)
	}
	tune := func(soloWait time.Duration) func(*middleware.StackConfig) {
		return func(c *middleware.StackConfig) {
			c.MaxDeliveries, c.MaxRetries, c.SoloWait = maxDeliveries, -1, soloWait
		}
	}
	crash.Store(true)
	crashOnce(t, e.stack(t, "billing", billing, tune(30*time.Second)), suspect) // delivery 1
	crash.Store(false)

	// A long delivery of another consumer holds the gate.
	long := e.stack(t, "shipping", func(m *message.Message) error {
		close(started)
		select {
		case <-finish:
		case <-time.After(30 * time.Second):
			return errors.New("the test never let the long delivery end")
		}
		return e.effect("shipping")(m)
	})
	longDone := make(chan error, 1)
	go func() {
		_, err := long(delivery(orderMsg("long")))
		longDone <- err
	}()
	<-started

	_, err := e.stack(t, "billing", billing, tune(200*time.Millisecond))(delivery(suspect)) // delivery 2
	if err == nil || !strings.Contains(err.Error(), "other deliveries still ran after 200ms") {
		t.Fatalf("the suspect's delivery returned %v; want it to fail, the long delivery still in progress after SoloWait", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the suspect's handler ran %d times, want once (its crash): past SoloWait it must not run", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of an attempt alone; the suspect never started one", n)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "billing"}); len(letters) != 0 {
		t.Fatalf("dead letters %+v; a suspect that could not run alone has not shown it crashes the process", letters)
	}
	select {
	case err := <-longDone:
		t.Fatalf("the long delivery ended (%v) before the test let it", err)
	default:
	}
	close(finish)
	if err := <-longDone; err != nil {
		t.Fatalf("the long delivery: %v", err)
	}

	if _, err := e.stack(t, "billing", billing, tune(30*time.Second))(delivery(suspect)); err != nil { // delivery 3
		t.Fatalf("the suspect's redelivery: %v", err)
	}
	if runs.Load() != 2 || alone.Load() != 3 {
		t.Fatalf("the suspect's handler ran %d times, the last on delivery %d; want its attempt alone on delivery 3",
			runs.Load(), alone.Load())
	}
	if n := e.count(t, "effects", "billing", suspect.UUID); n != 1 {
		t.Fatalf("%d effects of the suspect, want 1", n)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{}); len(letters) != 0 {
		t.Fatalf("dead letters %+v, want none", letters)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of attempts alone left behind", n)
	}
}

// With a poison topic, a dead-lettered message also goes there through Watermill's PoisonQueue, as
// received and with its metadata; the table keeps it for replay as well. A message that is merely
// retried never reaches the poison topic.
func deadLetterPoisonTopic[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	poisoned, err := bus.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	var failOnce atomic.Bool
	failOnce.Store(true)
	hf := func(m *message.Message) error {
		if m.UUID == "flaky" && failOnce.CompareAndSwap(true, false) {
			return errTransient
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) {
		c.DeadLetterPublisher, c.DeadLetterTopic, c.MaxRetries = bus, "poison", -1
	})
	redeliverUntilAcked(t, stack, message.NewMessage("flaky", []byte(`{"id":"f"}`)), 3)
	poison := message.NewMessage("poison-1", []byte("not json"))
	poison.Metadata.Set("origin", "test")
	if n := redeliverUntilAcked(t, stack, poison, 3); n != 1 {
		t.Fatalf("the poison took %d deliveries", n)
	}
	select {
	case m := <-poisoned:
		if m.UUID != "poison-1" || string(m.Payload) != "not json" || m.Metadata.Get("origin") != "test" ||
			!strings.Contains(m.Metadata.Get(wmiddleware.ReasonForPoisonedKey), "decode") {
			t.Fatalf("poison topic got %s %q %v", m.UUID, m.Payload, m.Metadata)
		}
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing reached the poison topic")
	}
	select {
	case m := <-poisoned:
		t.Fatalf("%s reached the poison topic too; only dead-lettered messages belong there", m.UUID)
	case <-time.After(100 * time.Millisecond):
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"}); len(letters) != 1 || letters[0].MessageID != "poison-1" {
		t.Fatalf("dead letters = %+v; the table keeps the dead-lettered message too", letters)
	}
}

// A dead letter replayed after the cause is fixed is processed once; replayed again, it is a
// duplicate. Runs through a Watermill router over an in-memory broker.
func replayOnceThenDuplicate[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	var broken atomic.Bool
	broken.Store(true)
	hf := func(m *message.Message) error {
		if broken.Load() {
			return errors.New("customer record missing")
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.MaxDeliveries = 2; c.MaxRetries = -1 })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("shipping", "orders", bus, func(m *message.Message) error {
		_, err := stack(m)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-router.Running()

	msg := orderMsg("o-1")
	if err := bus.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return len(e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})) == 1 }) {
		t.Fatal("the message was not dead-lettered")
	}
	letter := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})[0]
	if letter.Topic != "orders" || letter.Attempts != 2 {
		t.Fatalf("dead letter = %+v; want topic orders after 2 deliveries", letter)
	}
	broken.Store(false) // the cause is fixed
	replay := middleware.ReplayConfig{Store: e.Store, Publisher: bus}
	if _, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{}); !errors.Is(err, store.ErrEmptyFilter) {
		t.Fatalf("an empty filter replayed (%v); it must demand a selection or All", err)
	}
	replayed, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{IDs: []int64{letter.ID}})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay = %v, %v", replayed, err)
	}
	if !waitFor(10*time.Second, func() bool { return e.count(t, "effects", "shipping", msg.UUID) == 1 }) {
		t.Fatal("the replayed message was not processed")
	}
	if left := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"}); len(left) != 0 {
		t.Fatalf("%d dead letters still waiting after the replay", len(left))
	}
	// Replayed again (an operator's second try): absorbed by the inbox.
	again, err := middleware.ReplayInboxDeadLetters(ctx, replay, store.DeadLetterFilter{IDs: []int64{letter.ID}, IncludeReplayed: true})
	if err != nil || len(again) != 1 {
		t.Fatalf("second replay = %v, %v", again, err)
	}
	if !waitFor(10*time.Second, func() bool { return e.outcome(t, "shipping", "duplicate") == 1 }) {
		t.Fatal("the second replay was not counted as a duplicate")
	}
	if n := e.count(t, "effects", "shipping", msg.UUID); n != 1 {
		t.Fatalf("%d effects after two replays, want 1", n)
	}
}

func versioned(key string, version int64) *message.Message {
	m := orderMsg(key)
	outboxkit.SetPartitionKey(m, key)
	outboxkit.SetVersion(m, version)
	return m
}

func orderGuard[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var transient atomic.Bool
	hf := func(m *message.Message) error {
		switch m.Metadata.Get("test_fail") {
		case "permanent":
			return handlers.Permanent(errors.New("this version cannot be applied"))
		case "transient":
			if transient.Load() {
				return errTransient
			}
		}
		return e.effect("search")(m)
	}
	stack := e.stack(t, "search", hf, func(c *middleware.StackConfig) {
		c.OrderGuard = &middleware.OrderGuardConfig{}
		c.MaxDeliveries = 3
		c.MaxRetries = -1
	})
	applied := func(msgs ...*message.Message) bool {
		for _, m := range msgs {
			if e.count(t, "effects", "search", m.UUID) != 1 {
				return false
			}
		}
		return true
	}
	version := func() int {
		return e.MustInt(t, `SELECT version FROM {{schema}}.inbox_versions WHERE consumer = 'search' AND partition_key = 'order-1'`)
	}
	parked := func() int {
		return e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_parked WHERE consumer = 'search' AND partition_key = 'order-1'`)
	}
	v := make([]*message.Message, 12)
	for i := 1; i < len(v); i++ {
		v[i] = versioned("order-1", int64(i))
	}

	// v2 arrives before v1: parked in the database and acknowledged (it never waits in the
	// broker, where Kafka or Redis Streams would redeliver it in place, ahead of everything).
	if _, err := stack(delivery(v[2])); err != nil {
		t.Fatalf("v2 before v1: %v; want it parked and acknowledged", err)
	}
	if applied(v[2]) || parked() != 1 {
		t.Fatalf("v2 before v1: applied %v, %d parked; want it parked, not applied", applied(v[2]), parked())
	}
	// The consumer's stats say it waits.
	stats, err := middleware.Stats(context.Background(), e.Store)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Consumer != "search" || stats[0].Parked != 1 {
		t.Fatalf("stats = %+v, want search with 1 parked", stats)
	}
	// Its redelivery is a duplicate.
	if _, err := stack(delivery(v[2])); err != nil || parked() != 1 {
		t.Fatalf("v2 again: %v, %d parked", err, parked())
	}
	// v1 applies v1 and then v2, in one transaction.
	if _, err := stack(delivery(v[1])); err != nil {
		t.Fatal(err)
	}
	if !applied(v[1], v[2]) || version() != 2 || parked() != 0 {
		t.Fatalf("after v1: v1 and v2 applied %v, version %d, %d parked; want both, 2, 0", applied(v[1], v[2]), version(), parked())
	}
	// A stale event (a different message carrying an old version) is acknowledged and skipped.
	stale := versioned("order-1", 1)
	if _, err := stack(delivery(stale)); err != nil || e.count(t, "effects", "search", stale.UUID) != 0 {
		t.Fatalf("stale version: err %v; want acknowledged and skipped", err)
	}
	// A gap of two: v5 and v4 wait for v3, which applies all three in order.
	for _, m := range []*message.Message{v[5], v[4], v[3]} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !applied(v[3], v[4], v[5]) || version() != 5 || parked() != 0 {
		t.Fatalf("after v3: applied %v, version %d, %d parked", applied(v[3], v[4], v[5]), version(), parked())
	}
	// A parked version that fails for good when its turn comes is dead-lettered; its predecessor
	// commits, and the version after it stays parked until it is replayed.
	v[7].Metadata.Set("test_fail", "permanent")
	for _, m := range []*message.Message{v[7], v[8], v[6]} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !applied(v[6]) || applied(v[7]) || applied(v[8]) || version() != 6 || parked() != 1 {
		t.Fatalf("after v6: v6 %v v7 %v v8 %v, version %d, %d parked; want v6 alone applied, v8 parked",
			applied(v[6]), applied(v[7]), applied(v[8]), version(), parked())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{v[7].UUID}})
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "version 7") || !strings.Contains(letters[0].Reason, "cannot be applied") {
		t.Fatalf("dead letters = %+v; want v7 with its reason", letters)
	}
	// The replay of v7 (fixed) runs — its inbox row went with the park — and brings v8 along.
	fixed := delivery(v[7])
	fixed.Metadata.Set("test_fail", "")
	if _, err := stack(fixed); err != nil {
		t.Fatal(err)
	}
	if !applied(v[7], v[8]) || version() != 8 || parked() != 0 {
		t.Fatalf("after v7's replay: applied %v, version %d, %d parked", applied(v[7], v[8]), version(), parked())
	}
	// A parked version that fails for now rolls its predecessor back too: the predecessor's
	// redelivery tries both again.
	v[10].Metadata.Set("test_fail", "transient")
	transient.Store(true)
	if _, err := stack(delivery(v[10])); err != nil {
		t.Fatal(err)
	}
	if _, err := stack(delivery(v[9])); err == nil {
		t.Fatal("v9 succeeded although v10, parked behind it, failed")
	}
	if applied(v[9]) || applied(v[10]) || version() != 8 || parked() != 1 {
		t.Fatalf("after the failure: v9 %v v10 %v, version %d, %d parked; want nothing applied, v10 parked", applied(v[9]), applied(v[10]), version(), parked())
	}
	transient.Store(false)
	if _, err := stack(delivery(v[9])); err != nil || !applied(v[9], v[10]) || version() != 10 {
		t.Fatalf("v9 again: %v, applied %v, version %d", err, applied(v[9], v[10]), version())
	}
	// Messages without a version are not guarded.
	if _, err := stack(delivery(orderMsg("plain"))); err != nil {
		t.Fatal(err)
	}

	// Two deliveries of a new key at once, the second version first: whichever is judged first,
	// the other waits for it, so version 2 is never left parked behind an applied version 1.
	const keys = 20
	var wg sync.WaitGroup
	var failed atomic.Int32
	pairs := make([][2]*message.Message, keys)
	for k := range pairs {
		key := fmt.Sprintf("race-%d", k)
		pairs[k] = [2]*message.Message{versioned(key, 1), versioned(key, 2)}
		for _, m := range []*message.Message{pairs[k][1], pairs[k][0]} {
			wg.Add(1)
			go func(m *message.Message) {
				defer wg.Done()
				if _, err := stack(delivery(m)); err != nil {
					failed.Add(1)
				}
			}(m)
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d concurrent deliveries failed", failed.Load())
	}
	for _, p := range pairs {
		if !applied(p[0], p[1]) {
			t.Fatalf("key %s: version 1 applied %v, version 2 applied %v; want both", outboxkit.PartitionKey(p[0]), applied(p[0]), applied(p[1]))
		}
	}
}

// In the full stack, a delivery held through an outage of a dependency is counted once and never
// dead-lettered, not even with MaxDeliveries 1.
func outageNeitherCounts[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var tries atomic.Int32
	hf := func(m *message.Message) error {
		if tries.Add(1) <= 5 {
			return outboxkit.Unreachable(errors.New("payment gateway: connection refused"))
		}
		return e.effect("billing")(m)
	}
	stack := e.stack(t, "billing", hf, func(c *middleware.StackConfig) {
		c.MaxDeliveries = 1
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatalf("delivery failed: %v", err)
	}
	if tries.Load() != 6 || e.count(t, "effects", "billing", msg.UUID) != 1 {
		t.Fatalf("%d tries, %d effects; want the sixth try to apply the effect once", tries.Load(), e.count(t, "effects", "billing", msg.UUID))
	}
	if n := e.count(t, "dead_letters", "billing", msg.UUID); n != 0 {
		t.Fatal("a message was dead-lettered for an unreachable dependency")
	}
	if n := e.deliveries(t, "billing", msg.UUID); n != 1 {
		t.Fatalf("the held delivery was counted %d times, want 1", n)
	}
}

// heldUntilCancelled delivers msg through stack with a context it cancels once the consumer's
// circuit has opened and failed a probe — the message is held, not settled — and returns what the
// stack returned then.
func (e *consumerEnv[TTx]) heldUntilCancelled(t *testing.T, consumer string, stack message.HandlerFunc, msg *message.Message) error {
	t.Helper()
	ctx, cancel := context.WithCancel(msg.Context())
	defer cancel()
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := stack(msg)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for e.gauge(t, "outboxkit_consumer_circuit_state", consumer) != float64(middleware.CircuitOpen) {
		select {
		case err := <-done:
			t.Fatalf("the delivery was settled (%v) instead of being held", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer's circuit did not open")
		}
	}
	cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the held delivery did not end when its context did")
		return nil
	}
}

// gauge reads a gauge of consumer (-1 when it has none). Collectors that fail (on tables not
// migrated, say) do not stop the others' series.
func (e *consumerEnv[TTx]) gauge(t *testing.T, name, consumer string) float64 {
	t.Helper()
	families, _ := e.reg.Gather()
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == consumer {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// wrongTx is a transaction type no store gives.
type wrongTx struct{ _ int }

// A handler written for another transaction type than the store's is a mistake in the program:
// every message waits (the circuit holds it), nothing is dead-lettered or counted, and the error
// names both types.
func misconfiguredTxType[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	wrong := handlers.JSON(func(context.Context, *wrongTx, order) error { return nil })
	stack := e.stack(t, "shipping", wrong, func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	err := e.heldUntilCancelled(t, "shipping", stack, brokerDelivery(msg, false))
	var tte *outboxkit.TxTypeError
	if !errors.As(err, &tte) || !strings.Contains(err.Error(), "*storetest.wrongTx") || strings.Contains(err.Error(), "<nil>") {
		t.Fatalf("held with %v; want an *outboxkit.TxTypeError naming both types", err)
	}
	var store TTx
	if tte.Got == nil || tte.Got.String() == "" || !strings.Contains(err.Error(), fmt.Sprintf("%T", store)) && fmt.Sprintf("%T", store) != "<nil>" {
		t.Fatalf("the error names %v as the store's type: %v", tte.Got, err)
	}
	if n := e.count(t, "dead_letters", "shipping", msg.UUID); n != 0 {
		t.Fatal("a message was dead-lettered for a mistake in the program")
	}
	if n := e.count(t, "inbox", "shipping", msg.UUID); n != 0 {
		t.Fatal("the message has an inbox row although its handler never ran")
	}
	if n := e.deliveries(t, "shipping", msg.UUID); n > 1 {
		t.Fatalf("the held delivery was counted %d times, want at most once", n)
	}
}

// A message a subscriber delivered for another consumer than the stack's is held, not recorded
// under the stack's name.
func misconfiguredConsumer[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"), func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	msg := orderMsg("o-1")
	d := delivery(msg)
	d.SetContext(outboxkit.WithConsumer(context.Background(), "billing"))
	err := e.heldUntilCancelled(t, "shipping", stack, d)
	if !errors.Is(err, middleware.ErrWrongConsumer) || !strings.Contains(err.Error(), `"billing"`) {
		t.Fatalf("held with %v; want ErrWrongConsumer naming the subscription's consumer", err)
	}
	if e.count(t, "inbox", "shipping", msg.UUID)+e.count(t, "dead_letters", "shipping", msg.UUID)+e.count(t, "effects", "shipping", msg.UUID) != 0 {
		t.Fatal("the message was recorded, applied or dead-lettered under the stack's consumer")
	}
	// The same message, stamped with the stack's own consumer, goes through.
	ok := delivery(msg)
	ok.SetContext(outboxkit.WithConsumer(context.Background(), "shipping"))
	if _, err := stack(ok); err != nil || e.count(t, "effects", "shipping", msg.UUID) != 1 {
		t.Fatalf("the message delivered for the stack's consumer: %v, %d effects", err, e.count(t, "effects", "shipping", msg.UUID))
	}
}

// On tables never migrated, CheckSchema says which version to migrate to, and a consumer holds its
// messages (no hot redelivery loop) with the same error.
func misconfiguredNotMigrated[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	env := h.Open(t) // not migrated
	err := env.Store.CheckSchema(context.Background())
	if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "needs version") {
		t.Fatalf("CheckSchema on an empty schema: %v; want ErrNotMigrated naming the version needed", err)
	}
	e := &consumerEnv[TTx]{Env: env, reg: prometheus.NewRegistry(), now: time.Now}
	var runs atomic.Int32
	stack := e.stack(t, "shipping", func(*message.Message) error { runs.Add(1); return nil }, func(c *middleware.StackConfig) {
		c.CircuitBackoff = outboxkit.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}
	})
	err = e.heldUntilCancelled(t, "shipping", stack, delivery(orderMsg("o-1")))
	if !errors.Is(err, store.ErrNotMigrated) || runs.Load() != 0 {
		t.Fatalf("held with %v after %d handler runs; want ErrNotMigrated and no run", err, runs.Load())
	}
	if _, err := env.Store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.CheckSchema(context.Background()); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
}

// A message without an id (another producer's) cannot be deduplicated: it is dead-lettered on its
// first delivery, showing that delivery, and two different ones are kept apart.
func messageWithoutID[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"))
	for _, payload := range []string{`{"id":"a"}`, `{"id":"b"}`} {
		if _, err := stack(message.NewMessage("", []byte(payload))); err != nil {
			t.Fatalf("a message without an id: %v; want it dead-lettered and acknowledged", err)
		}
	}
	letters, err := e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 2 {
		t.Fatalf("%d dead letters for two different messages without an id, want 2: %+v", len(letters), letters)
	}
	for _, l := range letters {
		if l.Attempts != 1 || !strings.HasPrefix(l.MessageID, "no-id:") || !strings.Contains(l.Reason, "has no UUID") {
			t.Fatalf("dead letter %+v; want 1 delivery, a no-id: id and the reason", l)
		}
	}

	// One its subscriber could not read (brokerio.Undecodable): dead-lettered with the subscriber's
	// reason, the handler never run.
	bad := message.NewMessage("", []byte(`{"id":"c"}`))
	bad.Metadata.Set(outboxkit.MetadataUndecodable, "cannot read Redis stream entry 1-0 of orders: bad metadata")
	if _, err := stack(bad); err != nil {
		t.Fatalf("a message its subscriber could not read: %v; want it dead-lettered and acknowledged", err)
	}
	letters, err = e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping", ReasonContains: "stream entry 1-0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || !strings.HasPrefix(letters[0].MessageID, "no-id:") || !strings.Contains(letters[0].Reason, "bad metadata") ||
		!strings.Contains(letters[0].Reason, "fix its producer") || string(letters[0].Payload) != `{"id":"c"}` {
		t.Fatalf("dead letters %+v; want the message as it came, under a no-id: id, with the subscriber's reason", letters)
	}
}
