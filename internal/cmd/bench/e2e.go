package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// e2eImpl is one way to get an event from a business transaction to a consumer's effect.
type e2eImpl struct {
	name   string
	stock  bool
	tune   stockTuning
	shards int // consumers over key shards of the topic (outboxkit.ShardTopic); 0: one
	// pollOnly, when set, is the relay's poll interval with NOTIFY off on both sides: writers skip
	// pg_notify, whose commit-time lock serializes concurrent writers.
	pollOnly time.Duration
	// batched runs the consumer as a middleware.BatchConsumer.
	batched bool
	// log, when set, is the log relay's mode ("table" or "wal") in place of the polling relay;
	// writers wake nobody (in "wal" they write no row). It needs wal_level = logical.
	log string
	// probe also times each event's delivery to a raw AMQP consumer of a queue of its own bound
	// to the topic: what of the latency is the relay's and the broker's, what the consumer's.
	probe bool
	// clock, when set, timestamps every hand-over of each event (--log-parts breakdown).
	clock *stageClock
}

var (
	e2eOurs        = e2eImpl{name: "outboxkit"}
	e2eOursSharded = e2eImpl{name: fmt.Sprintf("outboxkit, %d key shards", consumerShards), shards: consumerShards}
	e2eBatched     = e2eImpl{name: "outboxkit batch consumer", batched: true}
	e2eStockTuned  = e2eImpl{name: "stock tuned", stock: true, tune: stockTuned}
	e2eStockAsShip = e2eImpl{name: "stock as shipped", stock: true, tune: stockDefaults}
)

// e2eResult is one timed run at a fixed offered rate.
type e2eResult struct {
	latencies []time.Duration // COMMIT returned → effect committed, per event
	missing   int             // events whose effect had not happened when the run gave up
	written   float64         // events/s the writers actually committed (below the offered rate when they lag)
	// relayStmts is the statements the relay sent per timed event (counted by pgx on its own
	// pool, from the end of the warm-up to the last effect).
	relayStmts float64
	// delivered, with e2eImpl.probe: COMMIT returned → delivered to the raw consumer, per event.
	delivered []time.Duration
	// breakdown, with e2eImpl.clock: the stages' table.
	breakdown string
}

// benchE2E offers events at fixed rates, each written in its own business transaction, and
// times commit → the consumer's effect committed, through the relay, RabbitMQ and an inbox
// consumer: outboxkit beside stock Watermill (watermill-sql publisher in the transaction,
// components/forwarder, watermill-amqp, and a consumer deduplicating in its own transaction).
func benchE2E(ctx context.Context, c config) ([]series, error) {
	pool, err := e2ePool(ctx, c.dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fmt.Printf("\nend to end: commit → consumer effect committed, RabbitMQ between; %s per rate, %d reps\n", c.e2eFor, c.reps)
	fmt.Printf("  stock tuned: poll %s, batch %d; as shipped: poll %s, batch %d\n",
		stockTuned.pollInterval, stockTuned.batchSize, stockDefaults.pollInterval, stockDefaults.batchSize)

	type run struct {
		impl e2eImpl
		rate int
	}
	runs := []run{{e2eOurs, 200}, {e2eBatched, 200}, {e2eStockTuned, 200}, {e2eStockAsShip, 200},
		{e2eOurs, 1000}, {e2eOursSharded, 1000}, {e2eBatched, 1000}, {e2eStockTuned, 1000}}
	stats := map[run]map[string]*series{}
	for _, r := range runs {
		stats[r] = map[string]*series{}
		for _, p := range []string{"p50", "p95", "p99", "max"} {
			stats[r][p] = &series{Name: fmt.Sprintf("%s at %d msg/s, %s", r.impl.name, r.rate, p), Unit: "ms"}
		}
		stats[r]["written"] = &series{Name: fmt.Sprintf("%s at %d msg/s, written", r.impl.name, r.rate), Unit: "msg/s"}
	}
	for rep := 1; rep <= c.reps; rep++ {
		for _, r := range runs {
			res, err := e2eOnce(ctx, c, pool, r.impl, r.rate, c.e2eFor)
			if err != nil {
				return nil, fmt.Errorf("%s at %d msg/s: %w", r.impl.name, r.rate, err)
			}
			s := stats[r]
			s["p50"].add(ms(percentile(res.latencies, 50)))
			s["p95"].add(ms(percentile(res.latencies, 95)))
			s["p99"].add(ms(percentile(res.latencies, 99)))
			s["max"].add(ms(percentile(res.latencies, 100)))
			note := ""
			if res.missing > 0 {
				note = fmt.Sprintf(" (%d effects still missing when the run gave up)", res.missing)
			}
			fmt.Printf("  round %d: %s at %d msg/s (written %.0f/s): p50 %.1f ms, p99 %.1f ms%s\n", rep, r.impl.name, r.rate,
				res.written, ms(percentile(res.latencies, 50)), ms(percentile(res.latencies, 99)), note)
			stats[r]["written"].add(res.written)
		}
	}
	var rows, ratios []series
	for _, r := range runs {
		for _, p := range []string{"p50", "p95", "p99", "max", "written"} {
			rows = append(rows, *stats[r][p])
		}
	}
	for _, rate := range []int{200, 1000} {
		ratios = append(ratios,
			ratio(fmt.Sprintf("stock tuned p50 / outboxkit p50 at %d msg/s", rate), *stats[run{e2eStockTuned, rate}]["p50"], *stats[run{e2eOurs, rate}]["p50"]),
			ratio(fmt.Sprintf("stock tuned p99 / outboxkit p99 at %d msg/s", rate), *stats[run{e2eStockTuned, rate}]["p99"], *stats[run{e2eOurs, rate}]["p99"]))
	}
	ratios = append(ratios,
		ratio("stock as shipped p50 / outboxkit p50 at 200 msg/s", *stats[run{e2eStockAsShip, 200}]["p50"], *stats[run{e2eOurs, 200}]["p50"]),
		ratio("stock tuned p99 / outboxkit sharded p99 at 1000 msg/s", *stats[run{e2eStockTuned, 1000}]["p99"], *stats[run{e2eOursSharded, 1000}]["p99"]),
		ratio("stock tuned p99 / outboxkit batch consumer p99 at 1000 msg/s", *stats[run{e2eStockTuned, 1000}]["p99"], *stats[run{e2eBatched, 1000}]["p99"]),
		ratio("stock tuned p50 / outboxkit batch consumer p50 at 200 msg/s", *stats[run{e2eStockTuned, 200}]["p50"], *stats[run{e2eBatched, 200}]["p50"]))
	fmt.Print(table("end-to-end latency", rows))
	fmt.Print(table("paired by round", ratios))

	best, err := e2eMaxRate(ctx, c, pool, e2eMaxImpls, e2eMaxRates)
	if err != nil {
		return nil, err
	}
	return slices.Concat(rows, ratios, best), nil
}

// benchE2EMax is the search for the highest sustained rate alone (--scenario e2e-max).
func benchE2EMax(ctx context.Context, c config) ([]series, error) {
	pool, err := e2ePool(ctx, c.dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	return e2eMaxRate(ctx, c, pool, e2eMaxImpls, e2eMaxRates)
}

// e2ePool is the end-to-end runs' pool: room for the writers, the relay and the consumers.
func e2ePool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 48
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// The e2e scenario's search: the consumer over key shards, and batched.
var (
	e2eMaxImpls = []e2eImpl{e2eOursSharded, e2eBatched}
	e2eMaxRates = []int{200, 400, 600, 800, 1000, 1250, 1500, 1750, 2000, 2500, 3000}
)

// e2eMaxRate finds, for each of impls, the highest of rates at which the p99 stays under 100 ms,
// every effect done and the writers keeping up: rates step up until one fails twice in a row (one
// run of half the usual length, and one more when it fails: a checkpoint's stall on this shared
// machine is not the pipeline's limit).
func e2eMaxRate(ctx context.Context, c config, pool *pgxpool.Pool, impls []e2eImpl, rates []int) ([]series, error) {
	var best []series
	for _, impl := range impls {
		b := series{Name: impl.name + ": highest offered rate with p99 < 100 ms", Unit: "msg/s"}
	rates:
		for _, rate := range rates {
			for attempt := 1; attempt <= 2; attempt++ {
				res, err := e2eOnce(ctx, c, pool, impl, rate, c.e2eFor/2)
				if err != nil {
					return nil, err
				}
				p99 := percentile(res.latencies, 99)
				probe := ""
				if impl.probe {
					probe = fmt.Sprintf(" (delivered p99 %.1f ms)", ms(percentile(res.delivered, 99)))
				}
				fmt.Printf("  step %s at %d msg/s, try %d (written %.0f/s): p99 %.1f ms%s, missing %d\n", impl.name, rate, attempt,
					res.written, ms(p99), probe, res.missing)
				if p99 < 100*time.Millisecond && res.missing == 0 && res.written >= 0.95*float64(rate) {
					b.Values = []float64{float64(rate)}
					continue rates
				}
			}
			break
		}
		best = append(best, b)
	}
	fmt.Print(table("sustained rate", best))
	return best, nil
}

// e2eOnce runs one implementation at one offered rate for d and collects the latencies: from the
// moment each writer's COMMIT returned to the moment the consumer's transaction with the effect
// committed (an effect that lands before its writer heard back counts 0).
func e2eOnce(ctx context.Context, c config, pool *pgxpool.Pool, impl e2eImpl, rate int, d time.Duration) (e2eResult, error) {
	schema, drop, err := newSchema(ctx, pool, "bench_e2e")
	if err != nil {
		return e2eResult{}, err
	}
	defer drop()
	quiet := impl.pollOnly > 0 || impl.log != "" // nobody listens for a NOTIFY
	writer := storeIn(pool, schema, pgxstore.Config{DisableNotify: quiet, WAL: impl.log == "wal"})
	inbox := storeIn(pool, schema, pgxstore.Config{DisableNotify: quiet})
	if impl.clock != nil {
		// The consumer on a pool of its own, whose transactions the clock times.
		cpool, err := clockedPool(ctx, pool, impl.clock)
		if err != nil {
			return e2eResult{}, err
		}
		defer cpool.Close()
		inbox = storeIn(cpool, schema, pgxstore.Config{DisableNotify: quiet})
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL);
		CREATE TABLE `+schema+`.effects (message_id text PRIMARY KEY);
		CREATE TABLE `+schema+`.processed (message_id text PRIMARY KEY)`); err != nil {
		return e2eResult{}, err
	}
	topic := "bench.e2e." + schema
	fwdTopic := "bench_e2e_fwd_" + schema
	group := "e2e"
	topics := outboxkit.ShardTopics(topic, impl.shards)
	if err := declareQueues(c.brokerURL, topics, group); err != nil {
		return e2eResult{}, err
	}
	defer deleteQueues(c.brokerURL, topics, group)
	var delivered sync.Map // uuid → delivered to the probe
	if impl.probe {
		stop, err := probeDeliveries(c.brokerURL, topics, &delivered)
		if err != nil {
			return e2eResult{}, err
		}
		defer stop()
	}
	defer pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s", "watermill_offsets_%s"`, fwdTopic, fwdTopic)) //nolint:errcheck
	// The relay's own pool, its statements counted.
	relayPool, stmts, err := countingPool(ctx, pool)
	if err != nil {
		return e2eResult{}, err
	}
	stmts.flush = flushTimer{impl.clock}
	defer relayPool.Close()

	total := int(float64(rate) * d.Seconds())
	warmN := max(50, rate/2) // half a second at the rate, untimed: connections, channels, plans
	var (
		warm      sync.Map // uuid → COMMIT returned, for the warm-up's events
		committed sync.Map // uuid → COMMIT returned, for the timed events
		effected  sync.Map // uuid → the effect's transaction committed
		effects   atomic.Int64
		warmDone  = make(chan struct{})
		allDone   = make(chan struct{})
	)
	// record is called once the consumer's transaction with the effect has committed. Whether
	// the writer has heard its COMMIT return yet does not matter: the two times meet at the end.
	record := func(uuid string) {
		if _, again := effected.LoadOrStore(uuid, time.Now()); again {
			return // a redelivery
		}
		switch effects.Add(1) {
		case int64(warmN):
			close(warmDone)
		case int64(warmN + total):
			close(allDone)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var dropSlot func() // the log relay's, once it has stopped
	defer func() {
		cancel()
		wg.Wait()
		if dropSlot != nil {
			dropSlot()
		}
	}()

	// The consumer.
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return e2eResult{}, err
	}
	effect := `INSERT INTO ` + schema + `.effects (message_id) VALUES ($1)`
	if impl.stock {
		sub, err := wamqp.NewSubscriber(wamqp.NewDurablePubSubConfig(c.brokerURL, wamqp.GenerateQueueNameTopicNameWithSuffix(group)), watermill.NopLogger{})
		if err != nil {
			return e2eResult{}, err
		}
		// The usual hand-written inbox: the message id and the effect in one transaction.
		router.AddConsumerHandler("stock", topic, sub, func(msg *message.Message) error {
			if err := pgx.BeginFunc(msg.Context(), pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(msg.Context(), `INSERT INTO `+schema+`.processed (message_id) VALUES ($1) ON CONFLICT DO NOTHING`, msg.UUID)
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				_, err = tx.Exec(msg.Context(), effect, msg.UUID)
				return err
			}); err != nil {
				return err
			}
			record(msg.UUID)
			return nil
		})
	} else if impl.batched {
		sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: c.brokerURL, Consumer: group, Unacked: consumerBatch})
		if err != nil {
			return e2eResult{}, err
		}
		h := middleware.NoPublish(handlers.JSON(func(ctx context.Context, tx pgx.Tx, o map[string]any) error {
			_, err := tx.Exec(ctx, effect, o["id"])
			return err
		}))
		if impl.clock != nil {
			h = impl.clock.handler(h)
		}
		bc, err := middleware.NewBatchConsumer(middleware.BatchConfig{
			StackConfig: middleware.StackConfig{Store: inbox, Consumer: group}, MaxBatch: consumerBatch, Linger: c.linger,
		}, ackWatcher{sub, record, impl.clock}, topic, h)
		if err != nil {
			return e2eResult{}, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = bc.Run(runCtx); _ = sub.Close() }()
		if err := started(bc.Running(), "batch consumer"); err != nil {
			return e2eResult{}, err
		}
	} else {
		for _, t := range topics {
			sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: c.brokerURL, Consumer: group})
			if err != nil {
				return e2eResult{}, err
			}
			stack, err := middleware.Stack(middleware.StackConfig{Store: inbox, Consumer: group})
			if err != nil {
				return e2eResult{}, err
			}
			h := router.AddConsumerHandler("ours-"+t, t, sub, handlers.JSON(func(ctx context.Context, tx pgx.Tx, o map[string]any) error {
				_, err := tx.Exec(ctx, effect, o["id"])
				return err
			}))
			h.AddMiddleware(append([]message.HandlerMiddleware{func(next message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					out, err := next(msg)
					if err == nil {
						record(msg.UUID) // the inbox transaction, with the effect, has committed
					}
					return out, err
				}
			}}, stack...)...)
		}
	}
	if !impl.batched {
		wg.Add(1)
		go func() { defer wg.Done(); _ = router.Run(runCtx) }()
		if err := started(router.Running(), "consumer"); err != nil {
			return e2eResult{}, err
		}
	}

	// The relay.
	if impl.stock {
		amqpCfg := wamqp.NewDurablePubSubConfig(c.brokerURL, nil)
		amqpCfg.Publish.ConfirmDelivery = true
		amqpCfg.Publish.ChannelPoolSize = impl.tune.channelPool
		amqpPub, err := wamqp.NewPublisher(amqpCfg, watermill.NopLogger{})
		if err != nil {
			return e2eResult{}, err
		}
		defer amqpPub.Close()
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(relayPool), wsql.SubscriberConfig{
			ConsumerGroup: "relay", PollInterval: impl.tune.pollInterval,
			SchemaAdapter:  wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: impl.tune.batchSize},
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
		}, watermill.NopLogger{})
		if err != nil {
			return e2eResult{}, err
		}
		fwd, err := wforwarder.NewForwarder(sub, amqpPub, watermill.NopLogger{}, wforwarder.Config{ForwarderTopic: fwdTopic})
		if err != nil {
			return e2eResult{}, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = fwd.Run(runCtx) }()
		defer fwd.Close()
		if err := started(fwd.Running(), "stock forwarder"); err != nil {
			return e2eResult{}, err
		}
	} else {
		amqpPub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
		if err != nil {
			return e2eResult{}, err
		}
		defer amqpPub.Close()
		var pub message.Publisher = amqpPub
		if impl.clock != nil {
			pub = clockedPublisher{amqpPub, impl.clock}
		}
		cfg := forwarder.Config{Store: storeIn(relayPool, schema, pgxstore.Config{PollOnly: impl.pollOnly > 0 || impl.log != ""}), Publisher: pub,
			Name: "e2e", TopicMapping: func(t, key string) string { return outboxkit.ShardTopic(t, key, impl.shards) },
			MaxInFlight: c.inFlight, BatchSize: c.batch} // 0: the defaults
		if impl.pollOnly > 0 {
			cfg.PollInterval = impl.pollOnly
		}
		relay, err := forwarder.New(cfg)
		if err != nil {
			return e2eResult{}, err
		}
		run, running := relay.Run, relay.Running()
		if impl.log != "" {
			lr, drop, err := newLogRelay(relayPool, relay, impl.log)
			if err != nil {
				return e2eResult{}, err
			}
			// Reading: the slot exists, so writers in WAL mode may write.
			run, running, dropSlot = lr.Run, lr.Reading(), drop
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(runCtx) }()
		if err := started(running, "relay"); err != nil {
			return e2eResult{}, err
		}
	}

	// Warm up untimed, then offer the timed events.
	if _, err := e2eOffer(ctx, pool, writer, topic, fwdTopic, impl, 0, warmN, rate, &warm); err != nil {
		return e2eResult{}, err
	}
	if err := waitFor(ctx, warmDone, 60*time.Second, func() error {
		return fmt.Errorf("warm-up: %d of %d effects after 60s", effects.Load(), warmN)
	}); err != nil {
		return e2eResult{}, err
	}
	s0 := stmts.n.Load()
	writeTime, err := e2eOffer(ctx, pool, writer, topic, fwdTopic, impl, warmN, total, rate, &committed)
	if err != nil {
		return e2eResult{}, err
	}
	select {
	case <-allDone:
	case <-time.After(d + 60*time.Second):
	case <-ctx.Done():
		return e2eResult{}, ctx.Err()
	}
	res := e2eResult{written: float64(total) / writeTime.Seconds(), relayStmts: float64(stmts.n.Load()-s0) / float64(total)}
	committed.Range(func(uuid, t0 any) bool {
		if t1, ok := effected.Load(uuid); ok {
			res.latencies = append(res.latencies, max(0, t1.(time.Time).Sub(t0.(time.Time))))
		}
		if t1, ok := delivered.Load(uuid); ok {
			res.delivered = append(res.delivered, max(0, t1.(time.Time).Sub(t0.(time.Time))))
		}
		return true
	})
	res.missing = total - len(res.latencies)
	if impl.clock != nil {
		res.breakdown = impl.clock.report(&committed, &effected, &delivered)
	}
	return res, nil
}

// e2eOffer writes n events numbered from first, each in its own business transaction, on a fixed
// schedule at rate (open loop: a slow pipeline does not slow the offered rate down), from 16
// writers, and records each commit time in committed.
func e2eOffer(ctx context.Context, pool *pgxpool.Pool, writer *pgxstore.Store, topic, fwdTopic string, impl e2eImpl, first, n, perSec int, committed *sync.Map) (time.Duration, error) {
	slots := make(chan int, n)
	writeErr := make(chan error, 1)
	var writers sync.WaitGroup
	for range 16 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range slots {
				if err := e2eWrite(ctx, pool, writer, topic, fwdTopic, impl, i, committed); err != nil {
					select {
					case writeErr <- err:
					default:
					}
					return
				}
			}
		}()
	}
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(float64(i) / float64(perSec) * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		slots <- first + i
	}
	close(slots)
	writers.Wait()
	select {
	case err := <-writeErr:
		return 0, err
	default:
		return time.Since(start), nil
	}
}

// e2eWrite is one business transaction: an order and its event.
func e2eWrite(ctx context.Context, pool *pgxpool.Pool, writer *pgxstore.Store, topic, fwdTopic string, impl e2eImpl, i int, committed *sync.Map) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+writer.Info().Schema+`.orders (customer) VALUES ($1) RETURNING id`, fmt.Sprint("c-", i%97)).Scan(&id); err != nil {
		return err
	}
	body, key := payload(i, 200)
	msg := pipeline.NewEvent("OrderPlaced", key, []byte(fmt.Sprintf(`{"id":%q,"order":%s}`, fmt.Sprint("e-", i), body)))
	if impl.stock {
		sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		if err := wforwarder.NewPublisher(sqlPub, wforwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(topic, msg); err != nil {
			return err
		}
	} else {
		pub, err := pipeline.NewPublisher(writer, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish(topic, msg); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committed.Store(msg.UUID, time.Now())
	return nil
}

// probeDeliveries consumes, with automatic acknowledgements, an exclusive queue bound to each of
// topics' exchanges, and records when each message (by id) arrived. stop closes it, and with it
// the queues.
func probeDeliveries(url string, topics []string, arrived *sync.Map) (stop func(), err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	for _, t := range topics {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err == nil {
			err = ch.QueueBind(q.Name, "", t, false, nil)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
		}
		if err != nil {
			conn.Close()
			wg.Wait()
			return nil, fmt.Errorf("probe queue on %s: %w", t, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				arrived.LoadOrStore(d.MessageId, time.Now())
			}
		}()
	}
	return func() { conn.Close(); wg.Wait() }, nil
}

// ackWatcher is a subscriber that calls record with a message's UUID once it is acknowledged: for
// the batch consumer, after the batch's transaction committed.
type ackWatcher struct {
	message.Subscriber
	record func(uuid string)
	clock  *stageClock // when set, told when each message is handed out
}

// Unacked is what the watched subscriber hands out at once, when it says (the batch consumer
// asks).
func (w ackWatcher) Unacked() int {
	if u, ok := w.Subscriber.(interface{ Unacked() int }); ok {
		return u.Unacked()
	}
	return 1
}

func (w ackWatcher) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message, cap(in))
	go func() {
		defer close(out)
		for m := range in {
			if w.clock != nil {
				w.clock.subReceived(m.UUID)
			}
			go func() {
				select {
				case <-m.Acked():
					w.record(m.UUID)
				case <-m.Nacked():
				case <-ctx.Done():
				}
			}()
			out <- m
		}
	}()
	return out, nil
}
