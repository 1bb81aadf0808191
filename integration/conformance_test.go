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
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
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
	var b strings.Builder
	fmt.Fprintf(&b, "\nconformance: %d events over %d keys, every 10th published twice, billing crashed midway\n", conformanceEvents, conformanceKeys)
	fmt.Fprintf(&b, "%-9s %9s %9s %10s %9s %12s %12s %8s\n", "backend", "shipping", "billing", "dup. sent", "absorbed", "inv. ship", "inv. bill", "time")
	for _, r := range results {
		fmt.Fprintf(&b, "%-9s %9d %9d %10d %9d %12d %12d %7.1fs\n", r.backend, r.effects["shipping"], r.effects["billing"],
			r.duplicatesPublished, r.duplicatesAbsorbed, r.inversions["shipping"], r.inversions["billing"], r.elapsed.Seconds())
	}
	t.Log(b.String())
}

// keepsOrderThroughCrash says where per-key order must hold even across the consumer crash: the
// broker redelivers what the dead consumer held before anything behind it.
var keepsOrderThroughCrash = map[string]bool{"amqp": true, "kafka": true, "postgres": true}

func runConformance(t *testing.T, bc backendCase) conformanceResult {
	pg := testenv.NewPG(t)
	url := bc.url(t)
	createEffects(t, pg)
	b := openBackend(t, url, bc.opts)                  // redis: a 2s ClaimAfter, so the crashed consumer's pending messages move on quickly
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

	consume := func(group string) (stop func()) { return startEffectConsumer(t, ctx, pg, b, topic, group) }
	consume("shipping")
	stopBilling := consume("billing")

	writeEvents(t, pg, topic, keys(conformanceKeys), conformanceEvents/conformanceKeys)
	pub := &duplicatingPublisher{Publisher: b.Publisher}
	relay := newRelay(t, pg, pub, func(c *forwarder.Config) { c.BatchSize = 200 })
	run(t, relay)

	count := func(group string) int { return countEffects(t, pg, group) }
	testenv.Eventually(t, 120*time.Second, "billing to be halfway", func() bool { return count("billing") >= conformanceEvents/2 })
	stopBilling()      // the crash: messages in flight are redelivered to the next billing process
	consume("billing") // the restarted process; the test's cleanup stops it

	for _, g := range []string{"shipping", "billing"} {
		testenv.Eventually(t, 180*time.Second, g+" to apply every event", func() bool { return count(g) >= conformanceEvents })
	}
	res := conformanceResult{backend: bc.scheme, effects: map[string]int{}, inversions: map[string]int{},
		duplicatesPublished: pub.dups.Load(), elapsed: time.Since(start)}
	stats, err := middleware.Stats(context.Background(), pg.Pool, string(pg.Schema))
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
		res.inversions[g] = pg.Int(t, `SELECT count(*) FROM (SELECT seq < max(seq) OVER (PARTITION BY key ORDER BY n
			ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS inverted FROM {{schema}}.effects WHERE consumer = $1) AS x
			WHERE inverted`, g)
	}
	if res.inversions["shipping"] > 0 && bc.features.GuaranteedOrderWithSingleSubscriber {
		t.Errorf("shipping (never crashed) applied %d events out of their key's order", res.inversions["shipping"])
	}
	if res.inversions["billing"] > 0 && keepsOrderThroughCrash[bc.scheme] {
		t.Errorf("billing applied %d events out of their key's order across the crash", res.inversions["billing"])
	}
	if res.duplicatesPublished == 0 {
		t.Error("no duplicate was published: the test proves nothing about deduplication")
	}
	return res
}

// createEffects makes the table the effect consumers write to: one row per applied event.
func createEffects(t *testing.T, pg *testenv.PG) {
	pg.Exec(t, `CREATE TABLE {{schema}}.effects (n bigserial PRIMARY KEY, consumer text NOT NULL,
		message_id text NOT NULL, key text NOT NULL, seq bigint NOT NULL, UNIQUE (consumer, message_id))`)
}

func countEffects(t *testing.T, pg *testenv.PG, group string) int {
	return pg.Int(t, `SELECT count(*) FROM {{schema}}.effects WHERE consumer = $1`, group)
}

// msgKey carries the message itself to the handler, which records its id, key and sequence.
type msgKey struct{}

// effectConsumerOpt tunes startEffectConsumer: the middleware stack's config, or a hook the
// handler calls first.
type effectConsumerOpt struct {
	stack func(*middleware.StackConfig)
	hook  func(*message.Message)
}

func withStack(fn func(*middleware.StackConfig)) effectConsumerOpt {
	return effectConsumerOpt{stack: fn}
}
func withHook(fn func(*message.Message)) effectConsumerOpt { return effectConsumerOpt{hook: fn} }

// startEffectConsumer runs a consumer group behind the full middleware stack whose effect is a
// row in effects (unique per consumer and message: a duplicate effect fails loudly). stop ends it
// as a crash would, without acknowledging what it holds.
func startEffectConsumer(t *testing.T, ctx context.Context, pg *testenv.PG, b *backends.Backend, topic, group string,
	opts ...effectConsumerOpt) (stop func()) {
	t.Helper()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	cfg := middleware.StackConfig{Pool: pg.Pool, Schema: string(pg.Schema), Consumer: group, MaxRetries: -1}
	var hooks []func(*message.Message)
	for _, o := range opts {
		if o.stack != nil {
			o.stack(&cfg)
		}
		if o.hook != nil {
			hooks = append(hooks, o.hook)
		}
	}
	stack, err := middleware.Stack(cfg)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	effects := pg.Schema.Ident() + ".effects"
	h := router.AddConsumerHandler(group, topic, sub, handlers.JSON(func(ctx context.Context, tx pgx.Tx, _ map[string]any) error {
		m := ctx.Value(msgKey{}).(*message.Message)
		for _, hook := range hooks {
			hook(m)
		}
		seq, _ := strconv.ParseInt(m.Metadata.Get(outboxkit.MetadataSeq), 10, 64)
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (consumer, message_id, key, seq) VALUES ($1, $2, $3, $4)`,
			group, m.UUID, outboxkit.PartitionKey(m), seq)
		return err
	}))
	h.AddMiddleware(append(stack, func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			m.SetContext(context.WithValue(m.Context(), msgKey{}, m))
			return next(m)
		}
	})...)
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(rctx) }()
	select {
	case <-router.Running():
	case <-time.After(60 * time.Second):
		t.Fatalf("%s consumer did not start", group)
	}
	var once sync.Once
	stop = func() { once.Do(func() { rcancel(); <-done; _ = sub.Close() }) }
	t.Cleanup(stop)
	return stop
}
