package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// The relay's rows of the failure matrix, through RabbitMQ, on every store.
func TestRelay_FailureMatrixOnEveryStore(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		fn   func(*testing.T, testDB)
	}{
		{"PerKeyOrderWithRandomFailures", relayRandomFailures},
		{"TwoRunLoops", relayTwoRunLoops},
		{"BrokerOutage", relayBrokerOutage},
		{"CrashAfterPublishBeforeMark", relayCrashBeforeMark},
	}
	for i, open := range everyStore(t) {
		t.Run(storeNames[i], func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.fn(t, open(t))
				})
			}
		})
	}
}

// Failure matrix: "publish fails for one message" — through the real broker, 20 keys × 200 events
// with random message failures: every key arrives in seq order, nothing is lost or repeated.
func relayRandomFailures(t *testing.T, db testDB) {
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	msgs := writeEvents(t, db, topic, keys(20), 200)

	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 11))
	var injected atomic.Int64
	pub := &faultyPublisher{inner: amqpPublisher(t, url), before: func(*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(10) == 0 {
			injected.Add(1)
			return errors.New("injected: message refused")
		}
		return nil
	}}
	relay := newRelay(t, db, pub, func(c *forwarder.Config) { c.MaxAttempts = 1000; c.MaxInFlight = 16 })
	storetest.RunForwarder(t, relay)

	got := q.WaitFor(t, len(msgs), 60*time.Second)
	if injected.Load() < 100 {
		t.Fatalf("only %d failures injected", injected.Load())
	}
	counts := countByUUID(got)
	for _, m := range msgs {
		if counts[m.UUID] != 1 {
			t.Fatalf("message %s arrived %d times, want once", m.UUID, counts[m.UUID])
		}
	}
	assertPerKeyOrder(t, got)
}

// Failure matrix: "two relays at once" — two Run loops (separate pools, as two processes) while
// events keep being written: every event arrives, none more than twice, per-key order held.
func relayTwoRunLoops(t *testing.T, db testDB) {
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	for i := 0; i < 2; i++ {
		storetest.RunForwarder(t, newRelay(t, db, amqpPublisher(t, url), func(c *forwarder.Config) {
			c.Store = db.Another(t)
			c.BatchSize = 50
		}))
	}
	var msgs []*message.Message
	for round := 0; round < 10; round++ { // written while both relays run
		msgs = append(msgs, writeEvents(t, db, topic, keys(25), 8)...)
	}
	got := q.WaitFor(t, len(msgs), 60*time.Second)
	counts := countByUUID(got)
	for _, m := range msgs {
		if c := counts[m.UUID]; c < 1 || c > 2 {
			t.Fatalf("message %s arrived %d times, want once (twice at most)", m.UUID, c)
		}
	}
	assertPerKeyOrder(t, got)
}

// Failure matrix: "broker down" — 1,000 events written during an outage wait with no attempt
// burned and none dead-lettered; when the broker returns they all arrive by themselves.
func relayBrokerOutage(t *testing.T, db testDB) {
	url := testenv.AMQPURL(t)
	proxy, proxied := testenv.ProxyURL(t, url)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	reg := prometheus.NewRegistry()
	relay := newRelay(t, db, amqpPublisher(t, proxied), func(c *forwarder.Config) {
		c.MaxAttempts = 3 // an outage counted as failures would dead-letter everything at once
		c.PublishTimeout = 2 * time.Second
		c.Metrics = prom.NewForwarderMetrics(reg)
	})
	storetest.RunForwarder(t, relay)

	before := writeEvents(t, db, topic, keys(10), 1)
	q.WaitFor(t, len(before), 30*time.Second)
	// A consumer can see a message before its publisher sees the confirm: wait for the marks.
	testenv.Eventually(t, 30*time.Second, "the first events to be marked", func() bool {
		return db.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})

	proxy.Cut()
	during := writeEvents(t, db, topic, keys(50), 20)
	// Let the relay meet the outage several times (its first try and failed probes), with its
	// circuit open. Several publishes of one pass can fail at once, so wait for both signs.
	testenv.Eventually(t, 30*time.Second, "the relay to fail against the outage with its circuit open", func() bool {
		return metricValue(t, reg, "outboxkit_forwarder_publish_failures_total", map[string]string{"kind": "unreachable"}) >= 3 &&
			metricValue(t, reg, "outboxkit_forwarder_circuit_state", nil) == 1
	})
	stats, err := relay.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.DeadLettered != 0 {
		t.Fatalf("%d rows dead-lettered by a broker outage", stats.DeadLettered)
	}
	if n := db.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0`); n != 0 {
		t.Fatalf("%d rows had attempts burned by the outage", n)
	}

	proxy.Restore()
	got := q.WaitFor(t, len(before)+len(during), 60*time.Second)
	counts := countByUUID(got)
	for _, m := range during {
		if counts[m.UUID] == 0 {
			t.Fatalf("message %s written during the outage never arrived", m.UUID)
		}
	}
	if n := db.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows carry attempts or dead letters after the outage", n)
	}
	assertPerKeyOrder(t, got)
}

// Failure matrix: "crash after publish, before mark", on any store — the pass ends between the
// broker's confirms and the mark, as a relay dying there would: the rows are published again by the
// next pass (on Postgres and MySQL at once, their locks gone with the pass; on SQLite when the
// dead pass's lease runs out), nothing is lost.
func relayCrashBeforeMark(t *testing.T, db testDB) {
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	msgs := writeEvents(t, db, topic, keys(5), 4)
	relay := newRelay(t, db, amqpPublisher(t, url), func(c *forwarder.Config) { c.MaxInFlight = 1 })
	var crashed atomic.Bool
	faults.Inject(relay, faults.AfterPublish, func() error {
		if crashed.CompareAndSwap(false, true) {
			return errors.New("the relay died after publishing, before marking")
		}
		return nil
	})
	storetest.RunForwarder(t, relay)
	testenv.Eventually(t, 60*time.Second, "every row to be marked published", func() bool {
		return db.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	got := q.WaitFor(t, 2*len(msgs), 30*time.Second) // the first pass had them all: each is sent twice
	counts := countByUUID(got)
	for _, m := range msgs {
		if counts[m.UUID] != 2 {
			t.Fatalf("message %s arrived %d times, want twice: once before the crash, once after", m.UUID, counts[m.UUID])
		}
	}
	assertPerKeyOrder(t, got)
}

// Failure matrix: "crash after publish, before mark", for real on Postgres — the relay's database
// sessions die right after the broker confirmed: the marks are lost, the rows are published again,
// nothing is lost.
func TestRelay_CrashAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	app := testenv.UniqueName(t, "relay")
	cfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	msgs := writeEvents(t, pgDB(pg), topic, keys(5), 4)
	var crashed atomic.Bool
	pub := &faultyPublisher{inner: amqpPublisher(t, url), after: func(*message.Message) {
		if crashed.CompareAndSwap(false, true) {
			// The broker has the message; now the relay's session dies before it can mark it.
			pg.Int(t, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app)
		}
	}}
	storetest.RunForwarder(t, newRelay(t, pgDB(pg), pub, func(c *forwarder.Config) { c.Store = pg.StoreOn(t, pool); c.MaxInFlight = 1 }))

	testenv.Eventually(t, 30*time.Second, "every row to be marked published", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	got := q.WaitFor(t, len(msgs)+1, 30*time.Second)
	counts := countByUUID(got)
	dupes := 0
	for _, m := range msgs {
		switch c := counts[m.UUID]; {
		case c == 0:
			t.Fatalf("message %s lost", m.UUID)
		case c > 1:
			dupes++
		}
	}
	if dupes == 0 {
		t.Fatal("no message was published twice: the crash did not land between publish and mark")
	}
	t.Logf("%d messages published twice after the crash; consumers' inboxes absorb them", dupes)
	assertPerKeyOrder(t, got)
}

// NOTIFY end to end: with a 10 s poll, committed events reach the broker queue in milliseconds.
func TestRelay_NotifyLatencyThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "orders")
	q := testenv.BindQueue(t, url, topic)
	storetest.RunForwarder(t, newRelay(t, pgDB(pg), amqpPublisher(t, url), func(c *forwarder.Config) { c.PollInterval = 10 * time.Second }))
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		writeEvents(t, pgDB(pg), topic, []string{"k"}, 1)
		q.WaitFor(t, i+1, 5*time.Second)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("commit → RabbitMQ consumer, poll 10s: median %s, p90 %s, max %s", lat[10], lat[18], lat[19])
	if lat[10] > time.Second {
		t.Fatalf("median %s: NOTIFY did not wake the relay", lat[10])
	}
}
