package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// benchKafkaTxn measures the transactional relay against the idempotent one, in one run: the
// drain of a preloaded outbox (rounds alternating between the two), then, at a steady 1,000
// events a second, the time from a writer's commit to the moment a read_committed consumer has
// the record, for the idempotent relay and the transactional one at several TransactionInterval
// settings, with the transactions each made a second.
func benchKafkaTxn(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	url := kafkaBenchURL(c)
	fmt.Printf("\nKafka, transactional relay vs idempotent: drain of %d preloaded events over %d keys, %d reps\n", c.events, c.keys, c.reps)
	idem := series{Name: "drain to Kafka, idempotent", Unit: "msg/s"}
	txn := series{Name: "drain to Kafka, transactional", Unit: "msg/s"}
	for rep := 1; rep <= c.reps; rep++ {
		a, err := drainKafka(ctx, c, pool, url, false, rep)
		if err != nil {
			return nil, fmt.Errorf("idempotent drain: %w", err)
		}
		b, err := drainKafka(ctx, c, pool, url, true, rep)
		if err != nil {
			return nil, fmt.Errorf("transactional drain: %w", err)
		}
		idem.add(a)
		txn.add(b)
		fmt.Printf("  round %d: idempotent %.0f, transactional %.0f msg/s (%.2f×)\n", rep, a, b, b/a)
	}
	out := []series{idem, txn, ratio("transactional / idempotent drain", txn, idem)}
	fmt.Print(table("drain to Kafka", out))

	const rateHz, lasting = 1000, 10 * time.Second
	fmt.Printf("\ncommit → visible to read_committed at %d events/s for %s, relay woken by NOTIFY\n", rateHz, lasting)
	for _, m := range []struct {
		name     string
		txn      bool
		interval time.Duration
	}{
		{"idempotent", false, 0},
		{"transactional, interval 0", true, 0},
		{"transactional, interval 10ms", true, 10 * time.Millisecond},
		{"transactional, interval 50ms", true, 50 * time.Millisecond},
		{"transactional, interval 100ms", true, 100 * time.Millisecond},
	} {
		lat, txns, err := kafkaVisible(ctx, c, pool, url, m.txn, m.interval, rateHz, lasting)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		extra := ""
		if m.txn {
			extra = fmt.Sprintf(", %.0f transactions/s", txns/lasting.Seconds())
		}
		fmt.Printf("  %-30s p50 %6.1f ms  p99 %6.1f ms  (%d events%s)\n", m.name, ms(p50), ms(p99), len(lat), extra)
		s50 := series{Name: "commit → visible p50, " + m.name, Unit: "ms"}
		s50.add(ms(p50))
		s99 := series{Name: "commit → visible p99, " + m.name, Unit: "ms"}
		s99.add(ms(p99))
		out = append(out, s50, s99)
	}
	return out, nil
}

// kafkaBenchURL is the Kafka of the run: --broker when it is one, else the local one.
func kafkaBenchURL(c config) string {
	if strings.HasPrefix(c.brokerURL, "kafka://") {
		return c.brokerURL
	}
	return env("OUTBOXKIT_TEST_KAFKA_URL", "kafka://127.0.0.1:9092")
}

func withTxnID(url, id string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "transactional_id=" + id
}

// drainKafka times the forwarder draining a preloaded outbox into Kafka: drained once every row
// is marked, which a transactional relay does only after its commit.
func drainKafka(ctx context.Context, c config, pool *pgxpool.Pool, url string, txn bool, rep int) (float64, error) {
	mode := "idem"
	if txn {
		mode = "txn"
	}
	schema, drop, err := newSchema(ctx, pool, fmt.Sprintf("bench_kafka_%s_%d", mode, rep))
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := schema + ".placed"
	if err := preloadOutboxkit(ctx, pool, schema, topic, c, quietRows); err != nil {
		return 0, err
	}
	if txn {
		url = withTxnID(url, schema)
	}
	b, err := backends.Open(ctx, url, backends.Options{})
	if err != nil {
		return 0, err
	}
	defer b.Close()
	outbox := storeIn(pool, schema, pgxstore.Config{})
	relay, err := drainRelay(c, outbox, b.Publisher, "bench")
	if err != nil {
		return 0, err
	}
	return timedDrain{events: c.events, run: []func(context.Context) error{relay.Run}, arrived: func() error {
		return drained(ctx, outbox)
	}}.rate(ctx)
}

// kafkaVisible writes events at rateHz for lasting, each in a transaction of its own, beside a
// relay woken by the writers and a read_committed consumer, and returns each event's time from
// its commit to its arrival at the consumer, and how many transactions the relay committed.
func kafkaVisible(ctx context.Context, c config, pool *pgxpool.Pool, url string, txn bool, interval time.Duration,
	rateHz int, lasting time.Duration) ([]time.Duration, float64, error) {
	schema, drop, err := newSchema(ctx, pool, "bench_kafka_visible")
	if err != nil {
		return nil, 0, err
	}
	defer drop()
	topic := schema + ".placed"
	relayURL := url
	if txn {
		relayURL = withTxnID(url, schema)
	}
	b, err := backends.Open(ctx, relayURL, backends.Options{})
	if err != nil {
		return nil, 0, err
	}
	defer b.Close()
	outbox := storeIn(pool, schema, pgxstore.Config{})
	relay, err := forwarder.New(forwarder.Config{Store: outbox, Publisher: b.Publisher, Name: "bench",
		TransactionInterval: interval, Retention: forwarder.Retention{Keep: true}})
	if err != nil {
		return nil, 0, err
	}

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		lat       []time.Duration
	)
	broker := strings.TrimPrefix(strings.SplitN(url, "?", 2)[0], "kafka://")
	// The topic exists before the consumer asks for it: a relay's first publish creates it.
	adm, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		return nil, 0, err
	}
	_, _ = kadm.NewClient(adm).CreateTopic(ctx, 4, -1, nil, topic)
	cons, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		adm.Close()
		return nil, 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = relay.Run(runCtx)
	}()
	go func() {
		defer wg.Done()
		for runCtx.Err() == nil {
			fs := cons.PollFetches(runCtx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				id := ""
				for _, h := range r.Headers {
					if h.Key == "_watermill_message_uuid" {
						id = string(h.Value)
					}
				}
				mu.Lock()
				if at, ok := committed[id]; ok {
					lat = append(lat, now.Sub(at))
					delete(committed, id)
				}
				mu.Unlock()
			})
		}
	}()
	<-relay.Running()

	// Writers: 4 goroutines, each committing one event every 4 ms (together rateHz).
	const writers = 4
	every := time.Duration(writers) * time.Second / time.Duration(rateHz)
	deadline := time.Now().Add(lasting)
	var wwg sync.WaitGroup
	var werr error
	var werrOnce sync.Once
	for w := range writers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; time.Now().Before(deadline); i++ {
				<-tick.C
				if err := writeOne(ctx, pool, outbox, topic, w*1_000_000+i, c.keys, &mu, committed); err != nil {
					werrOnce.Do(func() { werr = err })
					return
				}
			}
		}()
	}
	wwg.Wait()
	// Let the last ones arrive.
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		mu.Lock()
		left := len(committed)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()
	cons.Close()
	var txns float64
	if txn {
		if ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, "outboxkit.progress."+schema); err == nil {
			if o, ok := ends.Lookup("outboxkit.progress."+schema, 0); ok {
				txns = float64(o.Offset) / 2 // each transaction: its progress record and its marker
			}
			_, _ = kadm.NewClient(adm).DeleteTopics(ctx, "outboxkit.progress."+schema)
		}
	}
	_, _ = kadm.NewClient(adm).DeleteTopics(ctx, topic)
	adm.Close()
	if werr != nil {
		return nil, 0, werr
	}
	mu.Lock()
	missing := len(committed)
	mu.Unlock()
	if missing > 0 {
		return nil, 0, fmt.Errorf("%d events never reached the read_committed consumer", missing)
	}
	slices.Sort(lat)
	return lat, txns, nil
}

// writeOne commits one event in a transaction of its own and records when the commit returned.
func writeOne(ctx context.Context, pool *pgxpool.Pool, st *pgxstore.Store, topic string, i, keys int,
	mu *sync.Mutex, committed map[string]time.Time) error {
	body, key := payload(i, keys)
	msg := pipeline.NewEvent("OrderPlaced", key, body)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := pub.Publish(topic, []*message.Message{msg}...); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	// Recorded before the commit, under the lock the consumer takes: the record cannot be read
	// before the commit returns, and the commit's own time is in what is measured.
	mu.Lock()
	committed[msg.UUID] = time.Now()
	mu.Unlock()
	return tx.Commit(ctx)
}
