package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// consumerTests are the Consumer group: the consumer middleware's subtests, each in the file of
// its subject (consumer_inbox.go, consumer_dead_letters.go, …); this file holds what they share.
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
// runRouter runs router until the returned stop, which waits for it and fails the test on an
// error; it returns once the router runs.
func runRouter(t *testing.T, router *message.Router) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	}
}

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
