package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store/storetest"
)

const (
	conformanceEvents = 5000
	conformanceKeys   = 50
)

// conformanceResult is one row of the printed table.
type conformanceResult struct {
	backend             string
	effects             map[string]int
	duplicatesPublished int64
	duplicatesAbsorbed  int64
	inversions          map[string]int
	elapsed             time.Duration
}

// duplicatingPublisher publishes every 10th message twice, as a relay crashing between publish and
// mark would.
type duplicatingPublisher struct {
	message.Publisher
	n, dups atomic.Int64
}

func (p *duplicatingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.n.Add(1)%10 == 0 {
		if err := p.Publisher.Publish(topic, msgs...); err == nil {
			p.dups.Add(1)
		}
	}
	return nil
}

// The same conformance run for every backend: 5,000 events over 50 keys through the outbox, the
// forwarder and the broker to two inbox consumers, with duplicate publishes and a consumer crash
// midway. Every event's effect must happen exactly once per consumer. Per-key order is counted
// (first-processing inversions) and asserted where the backend keeps it through a crash.
func TestConformance_EveryBackend(t *testing.T) {
	var (
		mu      sync.Mutex
		results []conformanceResult
	)
	for _, bc := range backendCases {
		if !bc.features.Persistent {
			continue // the in-memory broker loses what a stopped consumer has not taken: nothing to conform to
		}
		t.Run(bc.scheme, func(t *testing.T) {
			r := runConformance(t, bc)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	t.Log(conformanceTable(results))
}

// The conformance run through RabbitMQ on every other store (TestConformance_EveryBackend runs it
// on Postgres through pgx), and on SQLite also through the in-process broker — the embedded
// setup, where no consumer crash is staged: the memory broker keeps nothing for a stopped one.
func TestConformance_EveryStore(t *testing.T) {
	var (
		mu      sync.Mutex
		results []conformanceResult
	)
	amqp, memory := backendCases[0], backendCases[len(backendCases)-1]
	if amqp.scheme != "amqp" || memory.scheme != "memory" {
		t.Fatalf("backendCases starts with %s and ends with %s; want amqp and memory", amqp.scheme, memory.scheme)
	}
	opens := everyStore(t)
	type run struct {
		store int
		bc    backendCase
		crash bool
	}
	runs := []run{{1, amqp, true}, {2, amqp, true}, {3, amqp, true}, {3, memory, false}}
	for _, r := range runs {
		t.Run(storeNames[r.store]+"/"+r.bc.scheme, func(t *testing.T) {
			t.Parallel()
			res := conformanceRun(t, opens[r.store](t), r.bc, r.crash)
			mu.Lock()
			results = append(results, res)
			mu.Unlock()
		})
	}
	t.Cleanup(func() { t.Log(conformanceTable(results)) })
}

// conformanceTable prints the results of conformance runs.
func conformanceTable(results []conformanceResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nconformance: %d events over %d keys, every 10th published twice, billing crashed midway (except on memory)\n", conformanceEvents, conformanceKeys)
	fmt.Fprintf(&b, "%-24s %9s %9s %10s %9s %12s %12s %8s\n", "backend on store", "shipping", "billing", "dup. sent", "absorbed", "inv. ship", "inv. bill", "time")
	for _, r := range results {
		fmt.Fprintf(&b, "%-24s %9d %9d %10d %9d %12d %12d %7.1fs\n", r.backend, r.effects["shipping"], r.effects["billing"],
			r.duplicatesPublished, r.duplicatesAbsorbed, r.inversions["shipping"], r.inversions["billing"], r.elapsed.Seconds())
	}
	return b.String()
}

// The conformance run again with both consumers batching (middleware.BatchConsumer), on every
// backend: the same exactly-once effects, the same order guarantees.
func TestConformance_BatchConsumerEveryBackend(t *testing.T) {
	var (
		mu      sync.Mutex
		results []conformanceResult
	)
	for _, bc := range backendCases {
		if !bc.features.Persistent {
			continue
		}
		t.Run(bc.scheme, func(t *testing.T) {
			t.Parallel()
			r := conformanceRun(t, pgDB(testenv.NewPG(t)), bc, true, withBatch(conformanceBatch))
			r.backend += ", batched"
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	t.Cleanup(func() { t.Log(conformanceTable(results)) })
}

// keepsOrderThroughCrash says where per-key order must hold even across the consumer crash: the
// broker redelivers what the dead consumer held before anything behind it.
var keepsOrderThroughCrash = map[string]bool{"amqp": true, "kafka": true, "postgres": true}

func runConformance(t *testing.T, bc backendCase) conformanceResult {
	return conformanceRun(t, pgDB(testenv.NewPG(t)), bc, true)
}

// handsOutRuns lists the brokers whose subscribers hand out runs of messages (Options.Unacked).
var handsOutRuns = map[string]bool{"amqp": true, "nats": true, "redis": true, "kafka": true}

// conformanceBatch is the batch size of the conformance run through the batch consumer.
const conformanceBatch = 50

// conformanceRun sends the events of the conformance run through db and bc's broker; with crash,
// the billing consumer is stopped halfway, as a crash would, and started again. opts tune both
// consumers (withBatch runs them as batch consumers).
func conformanceRun(t *testing.T, db testDB, bc backendCase, crash bool, opts ...effectConsumerOpt) conformanceResult {
	url := bc.url(t)
	createEffects(t, db)
	bopts := bc.opts
	for _, o := range opts {
		if o.batch > 0 && handsOutRuns[bc.scheme] {
			bopts.Unacked = o.batch // the subscriber hands out a batch
		}
	}
	b := openBackend(t, url, bopts)
	topic := testenv.UniqueName(t, "conf") + ".placed" // dotted, as topics usually are
	dropWhenDone(t, bc.scheme, url, []string{topic}, []string{"shipping", "billing"})
	if bc.scheme == "amqp" {
		for _, g := range []string{"shipping", "billing"} {
			testenv.DeclareQueue(t, url, topic, g) // queues exist before the first publish
		}
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	consume := func(group string) (stop func()) { return startEffectConsumer(t, ctx, db, b, topic, group, opts...) }
	consume("shipping")
	stopBilling := consume("billing")

	writeEvents(t, db, topic, keys(conformanceKeys), conformanceEvents/conformanceKeys)
	pub := &duplicatingPublisher{Publisher: b.Publisher}
	relay := newRelay(t, db, pub, func(c *forwarder.Config) { c.BatchSize = 200 })
	storetest.RunForwarder(t, relay)

	count := func(group string) int { return countEffects(t, db, group) }
	if crash {
		testenv.Eventually(t, 120*time.Second, "billing to be halfway", func() bool { return count("billing") >= conformanceEvents/2 })
		stopBilling()      // the crash: messages in flight are redelivered to the next billing process
		consume("billing") // the restarted process; the test's cleanup stops it
	}

	for _, g := range []string{"shipping", "billing"} {
		testenv.Eventually(t, 180*time.Second, g+" to apply every event", func() bool { return count(g) >= conformanceEvents })
	}
	res := conformanceResult{backend: bc.scheme + " on " + db.Name(), effects: map[string]int{}, inversions: map[string]int{},
		duplicatesPublished: pub.dups.Load(), elapsed: time.Since(start)}
	stats, err := middleware.Stats(context.Background(), db.Store())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		res.duplicatesAbsorbed += s.Duplicates
	}
	for _, g := range []string{"shipping", "billing"} {
		res.effects[g] = count(g)
		if res.effects[g] != conformanceEvents {
			t.Errorf("%s applied %d effects, want exactly %d", g, res.effects[g], conformanceEvents)
		}
		// An inversion: a key's event applied after a later event of the same key.
		res.inversions[g] = db.Int(t, `SELECT count(*) FROM (SELECT CASE WHEN seq < max(seq) OVER (PARTITION BY pkey ORDER BY n
			ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 1 ELSE 0 END AS inverted FROM {{schema}}.effects WHERE consumer = ?) AS x
			WHERE inverted = 1`, g)
	}
	if res.inversions["shipping"] > 0 && bc.features.GuaranteedOrderWithSingleSubscriber {
		t.Errorf("shipping (never crashed) applied %d events out of their key's order", res.inversions["shipping"])
	}
	if res.inversions["billing"] > 0 && (keepsOrderThroughCrash[bc.scheme] || !crash && bc.features.GuaranteedOrderWithSingleSubscriber) {
		t.Errorf("billing applied %d events out of their key's order across the crash", res.inversions["billing"])
	}
	if res.duplicatesPublished == 0 {
		t.Error("no duplicate was published: the test proves nothing about deduplication")
	}
	return res
}

// createEffects makes the table the effect consumers write to: one row per applied event.
func createEffects(t *testing.T, db testDB) { db.Exec(t, effectsDDL(db.Dialect())) }

func countEffects(t *testing.T, db testDB, group string) int {
	return db.Int(t, `SELECT count(*) FROM {{schema}}.effects WHERE consumer = ?`, group)
}

// effectConsumerOpt tunes startEffectConsumer: the middleware stack's config, or a hook the
// handler calls first.
type effectConsumerOpt struct {
	stack func(*middleware.StackConfig)
	hook  func(*message.Message)
	batch int // run it as a middleware.BatchConsumer with this MaxBatch
}

// withBatch runs the consumer as a middleware.BatchConsumer of up to max messages per
// transaction (open the backend with Options.Unacked for batches to fill on RabbitMQ).
func withBatch(max int) effectConsumerOpt { return effectConsumerOpt{batch: max} }

func withStack(fn func(*middleware.StackConfig)) effectConsumerOpt {
	return effectConsumerOpt{stack: fn}
}
func withHook(fn func(*message.Message)) effectConsumerOpt { return effectConsumerOpt{hook: fn} }

// startEffectConsumer runs a consumer group behind the full middleware stack whose effect is a
// row in effects (unique per consumer and message: a duplicate effect fails loudly). stop ends it
// as a crash would, without acknowledging what it holds.
func startEffectConsumer(t *testing.T, ctx context.Context, db testDB, b *backends.Backend, topic, group string,
	opts ...effectConsumerOpt) (stop func()) {
	t.Helper()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	cfg := middleware.StackConfig{Store: db.Store(), Consumer: group, MaxRetries: -1}
	var hooks []func(*message.Message)
	batch := 0
	for _, o := range opts {
		if o.stack != nil {
			o.stack(&cfg)
		}
		if o.hook != nil {
			hooks = append(hooks, o.hook)
		}
		batch = max(batch, o.batch)
	}
	effect := db.Effect(func(_ context.Context, m *message.Message) (string, []any) {
		for _, hook := range hooks {
			hook(m)
		}
		seq, _ := strconv.ParseInt(m.Metadata.Get(outboxkit.MetadataSeq), 10, 64)
		return `INSERT INTO {{schema}}.effects (consumer, message_id, pkey, seq) VALUES (?, ?, ?, ?)`,
			[]any{group, m.UUID, outboxkit.PartitionKey(m), seq}
	})
	var (
		run     func(context.Context) error
		running <-chan struct{}
	)
	if batch > 0 {
		bc, err := middleware.NewBatchConsumer(middleware.BatchConfig{StackConfig: cfg, MaxBatch: batch}, sub, topic, middleware.NoPublish(effect))
		if err != nil {
			t.Fatal(err)
		}
		run, running = bc.Run, bc.Running()
	} else {
		stack, err := middleware.Stack(cfg)
		if err != nil {
			t.Fatal(err)
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		router.AddConsumerHandler(group, topic, sub, effect).AddMiddleware(stack...)
		run, running = router.Run, router.Running()
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = run(rctx) }()
	select {
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s consumer did not start", group)
	}
	var once sync.Once
	stop = func() { once.Do(func() { rcancel(); <-done; _ = sub.Close() }) }
	t.Cleanup(stop)
	return stop
}
