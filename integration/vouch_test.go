package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
)

// vouchCases are the brokers that say which deliveries are first ones: those with subscribers of
// outboxkit's own (NATS with a 2s AckWait: a crashed consumer's message back in 2s).
var vouchCases = func() []backendCase {
	var out []backendCase
	for _, bc := range backendCases {
		if handsOutRuns[bc.scheme] {
			out = append(out, bc)
		}
	}
	return out
}()

// vouchMessages is how many messages the happy path sends.
const vouchMessages = 1000

// publishEvents publishes events with the given keys straight to the broker.
func publishEvents(t testing.TB, b *backends.Backend, topic string, keys ...string) []*message.Message {
	t.Helper()
	var msgs []*message.Message
	for i, k := range keys {
		msgs = append(msgs, pipeline.NewEvent("ShipmentRequested", k, []byte(fmt.Sprintf(`{"id":%q,"n":%d}`, k, i))))
	}
	for start := 0; start < len(msgs); start += 100 {
		if err := b.Publisher.Publish(topic, msgs[start:min(start+100, len(msgs))]...); err != nil {
			t.Fatal(err)
		}
	}
	return msgs
}

// vouchTopic makes a topic (and RabbitMQ's queue for billing) and drops it when the test ends.
func vouchTopic(t *testing.T, vc backendCase, url string) string {
	topic := testenv.UniqueName(t, "vouch") + ".placed"
	dropWhenDone(t, vc.scheme, url, []string{topic}, []string{"billing"})
	if vc.scheme == "amqp" {
		testenv.DeclareQueue(t, url, topic, "billing")
	}
	return topic
}

// On every broker, a first delivery that succeeds writes its inbox row and nothing else: the broker
// says it is the first (RabbitMQ's redelivered flag, JetStream's delivery count, a Redis entry read
// as new, a Kafka record past the group's read horizon), so no delivery-count row is written.
func TestDeliveryCount_FirstDeliveriesWriteNoRowOnEveryBroker(t *testing.T) {
	for _, vc := range vouchCases {
		for _, batched := range []bool{false, true} {
			name := vc.scheme
			if batched {
				name += "/batched"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				pg := testenv.NewPG(t)
				db := pgDB(pg)
				createEffects(t, db)
				url := vc.url(t)
				topic := vouchTopic(t, vc, url)
				opts := vc.opts
				var consumerOpts []effectConsumerOpt
				if batched {
					opts.Unacked = 50
					consumerOpts = append(consumerOpts, withBatch(50))
				}
				b := openBackend(t, url, opts)
				publishEvents(t, b, topic, keys(vouchMessages)...)
				startEffectConsumer(t, context.Background(), db, b, topic, "billing", consumerOpts...)
				testenv.Eventually(t, 120*time.Second, "every message to be applied", func() bool {
					return countEffects(t, db, "billing") >= vouchMessages
				})
				rows := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries`)
				t.Logf("%s: %d delivery-count rows per %d messages", name, rows, vouchMessages)
				if rows != 0 {
					t.Errorf("%d delivery-count rows for %d first deliveries, want none", rows, vouchMessages)
				}
			})
		}
	}
}

// On every broker, a message that kills the consumer is counted on its redeliveries, though its
// first delivery wrote nothing, and is dead-lettered once delivered more than MaxDeliveries times
// and crashed the process once more on its attempt alone in it; the others are applied once.
func TestDeliveryCount_CrashingMessageIsCountedAndDeadLetteredOnEveryBroker(t *testing.T) {
	for _, vc := range vouchCases {
		t.Run(vc.scheme, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			createEffects(t, db)
			url := vc.url(t)
			topic := vouchTopic(t, vc, url)
			b := openBackend(t, url, vc.opts)
			ids := append(append(goods(20), "crash"), goods(40)[20:]...)
			msgs := publishEvents(t, b, topic, ids...)
			crash := msgs[20].UUID
			const maxDeliveries = 2
			for i := 1; i <= maxDeliveries+1; i++ { // each delivery kills the process, the last one alone in it
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashingConsumer$", "-test.v")
				cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_CRASH="+strings.Join([]string{
					vc.scheme, url, pg.URL, string(pg.Schema), topic, crash}, "|"))
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 7 {
					t.Fatalf("delivery %d did not kill the consumer process (%v):\n%s", i, err, out)
				}
			}
			startEffectConsumer(t, context.Background(), db, b, topic, "billing",
				withStack(func(c *middleware.StackConfig) { c.MaxDeliveries = maxDeliveries }))
			testenv.Eventually(t, 120*time.Second, "the others to be applied and the crashing one dead-lettered", func() bool {
				return countEffects(t, db, "billing") >= len(msgs)-1 && pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`) >= 1
			})
			if n := countEffects(t, db, "billing"); n != len(msgs)-1 {
				t.Fatalf("%d effects, want %d", n, len(msgs)-1)
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE message_id = $1 AND deliveries = $2`, crash, maxDeliveries+2); n != 1 {
				t.Fatalf("the crashing message was not dead-lettered on delivery %d (%d rows)", maxDeliveries+2, n)
			}
		})
	}
}

// TestHelperCrashingConsumer is the consumer process of TestDeliveryCount_CrashingMessage…: a
// consumer behind the full stack that exits with status 7 in the handler of the message the test
// names.
func TestHelperCrashingConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_CRASH")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	scheme, url, pgURL, schemaName, topic, crash := p[0], p[1], p[2], p[3], p[4], p[5]
	var opts backends.Options
	for _, vc := range vouchCases {
		if vc.scheme == scheme {
			opts = vc.opts
		}
	}
	pg := testenv.AttachPG(t, pgURL, schemaName)
	b := openBackend(t, url, opts)
	startEffectConsumer(t, context.Background(), pgDB(pg), b, topic, "billing",
		withStack(func(c *middleware.StackConfig) { c.MaxDeliveries = 2 }),
		withHook(func(m *message.Message) {
			if m.UUID == crash {
				os.Exit(7) // the process dies in the handler, its transaction open
			}
		}))
	time.Sleep(90 * time.Second) //nolint:forbidigo // the subprocess lives until the crashing message kills it; 90 s bounds it
	t.Fatal("the consumer ran out of time without reaching the message that kills it")
}

// On every broker that hands out runs of messages, the batch consumer commits them in batches (not
// one message per transaction, the per-message fallback) and keeps each key's order.
func TestBatch_EveryBrokerHandsOutRunsInKeyOrder(t *testing.T) {
	for _, vc := range vouchCases {
		t.Run(vc.scheme, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			createEffects(t, db)
			url := vc.url(t)
			topic := vouchTopic(t, vc, url)
			opts := vc.opts
			opts.Unacked = 50
			b := openBackend(t, url, opts)
			publishEvents(t, b, topic, writeOrder(keys(20), 25)...) // 25 events per key, keys interleaved
			var (
				mu      sync.Mutex
				perTx   = map[pgx.Tx]int{}
				lastN   = map[string]int{}
				inverse int
			)
			startEffectConsumer(t, context.Background(), db, b, topic, "billing", withBatch(50), withHook(func(m *message.Message) {
				tx, _, _ := outboxkit.TxFrom[pgx.Tx](m.Context())
				var body struct{ N int }
				_ = json.Unmarshal(m.Payload, &body)
				mu.Lock()
				defer mu.Unlock()
				perTx[tx]++
				key := outboxkit.PartitionKey(m)
				if last, ok := lastN[key]; ok && body.N < last {
					inverse++
				}
				lastN[key] = body.N
			}))
			testenv.Eventually(t, 120*time.Second, "every message to be applied", func() bool {
				return countEffects(t, db, "billing") >= 500
			})
			mu.Lock()
			defer mu.Unlock()
			largest := 0
			for _, n := range perTx {
				largest = max(largest, n)
			}
			t.Logf("%s: 500 messages in %d transactions, the largest of %d", vc.scheme, len(perTx), largest)
			if largest < 10 {
				t.Errorf("the largest batch held %d messages: the batch consumer ran one message at a time", largest)
			}
			if inverse > 0 {
				t.Errorf("%d messages handled before an earlier one of their key", inverse)
			}
		})
	}
}

// writeOrder lists perKey events for each key, the keys interleaved, as writers produce them.
func writeOrder(keys []string, perKey int) []string {
	var out []string
	for i := 0; i < perKey; i++ {
		out = append(out, keys...)
	}
	return out
}

// Failure matrix, batched, on every broker: the consumer process dies inside a batch, after some of
// its handlers ran and before the commit. Nothing of the batch is left; the restarted consumer
// applies every message once, counting the redelivered ones.
func TestBatch_CrashMidBatchOnEveryBroker(t *testing.T) {
	for _, vc := range vouchCases {
		t.Run(vc.scheme, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			createEffects(t, db)
			url := vc.url(t)
			topic := vouchTopic(t, vc, url)
			opts := vc.opts
			opts.Unacked = 50
			b := openBackend(t, url, opts)
			msgs := publishEvents(t, b, topic, append(append(goods(10), "crash"), goods(30)[10:]...)...)
			crash := msgs[10].UUID

			handled := filepath.Join(t.TempDir(), "handled")
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashingBatchConsumer$", "-test.v")
			cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_CRASH_BATCH="+strings.Join([]string{
				vc.scheme, url, pg.URL, string(pg.Schema), topic, crash, handled}, "|"))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 7 {
				t.Fatalf("the consumer process did not die in the batch (%v):\n%s", err, out)
			}
			raw, _ := os.ReadFile(handled)
			if ran := strings.Count(string(raw), "\n"); ran < 5 {
				t.Fatalf("%d handlers ran in the batch before the crash; the test needs the crash mid-batch:\n%s", ran, out)
			}
			if n := countEffects(t, db, "billing"); n != 0 {
				t.Fatalf("%d effects of the crashed batch survived: a batch commits whole or not at all", n)
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox`); n != 0 {
				t.Fatalf("%d inbox rows of the crashed batch survived", n)
			}

			startEffectConsumer(t, context.Background(), db, b, topic, "billing", withBatch(50))
			testenv.Eventually(t, 60*time.Second, "every message to be applied after the restart", func() bool {
				return countEffects(t, db, "billing") >= len(msgs)
			})
			if n := countEffects(t, db, "billing"); n != len(msgs) {
				t.Fatalf("%d effects, want exactly %d", n, len(msgs))
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE deliveries = 2`); n < 11 {
				t.Fatalf("%d redelivered messages counted as second deliveries, want at least the 11 the crash held", n)
			}
		})
	}
}

// TestHelperCrashingBatchConsumer is the consumer process of TestBatch_CrashMidBatchOnEveryBroker: a
// batch consumer that lingers so the whole topic is one batch, notes each message its handler runs
// for, and exits with status 7 in the handler of the message the test names.
func TestHelperCrashingBatchConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_CRASH_BATCH")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	scheme, url, pgURL, schemaName, topic, crash, handled := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	var opts backends.Options
	for _, vc := range vouchCases {
		if vc.scheme == scheme {
			opts = vc.opts
		}
	}
	opts.Unacked = 50
	pg := testenv.AttachPG(t, pgURL, schemaName)
	b := openBackend(t, url, opts)
	sub, err := b.NewSubscriber("billing")
	if err != nil {
		t.Fatal(err)
	}
	notes, err := os.OpenFile(handled, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	effect := pgDB(pg).Effect(func(_ context.Context, m *message.Message) (string, []any) {
		if m.UUID == crash {
			os.Exit(7) // the process dies mid-batch, its transaction open
		}
		_, _ = notes.WriteString(m.UUID + "\n")
		return `INSERT INTO {{schema}}.effects (consumer, message_id, pkey, seq) VALUES (?, ?, ?, 0)`, []any{"billing", m.UUID, m.UUID}
	})
	bc, err := middleware.NewBatchConsumer(middleware.BatchConfig{
		StackConfig: middleware.StackConfig{Store: pg.Store, Consumer: "billing", MaxRetries: -1},
		MaxBatch:    50, Linger: 2 * time.Second,
	}, sub, topic, middleware.NoPublish(effect))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = bc.Run(ctx)
	t.Fatal("the consumer ran out of time without reaching the message that kills it")
}
