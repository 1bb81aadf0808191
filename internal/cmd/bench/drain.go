package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// stockTuning is how stock Watermill is set up. "defaults" leaves every knob as shipped (1 s poll,
// batches of 100, and watermill-amqp opening a channel for every publish). "tuned" gives it a
// 10 ms poll, batches of 1,000 and a pooled channel. Its forwarder handles one message at a time by
// design (the SQL subscriber waits for each ack), so no other knob changes its rate.
type stockTuning struct {
	name         string
	pollInterval time.Duration
	batchSize    int
	channelPool  int
}

var (
	stockDefaults = stockTuning{name: "defaults", pollInterval: time.Second, batchSize: 100, channelPool: 0}
	stockTuned    = stockTuning{name: "tuned", pollInterval: 10 * time.Millisecond, batchSize: 1000, channelPool: 1}
)

func benchDrain(ctx context.Context, c config) ([]series, error) {
	if c.store != "postgres" {
		return benchDrainStore(ctx, c)
	}
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("cannot reach Postgres at %s: %w", c.dbURL, err)
	}
	fmt.Printf("\ndrain: %d preloaded events over %d keys → RabbitMQ with publisher confirms, %d reps\n", c.events, c.keys, c.reps)
	fmt.Printf("  stock Watermill: watermill-sql v4 subscriber + components/forwarder → watermill-amqp with confirms;\n")
	fmt.Printf("    defaults: poll %s, batch %d, a channel per publish; tuned: poll %s, batch %d, pooled channel\n",
		stockDefaults.pollInterval, stockDefaults.batchSize, stockTuned.pollInterval, stockTuned.batchSize)

	raw := series{Name: "raw amqp091, pipelined confirms", Unit: "msg/s"}
	ours := series{Name: "outboxkit forwarder", Unit: "msg/s"}
	stock := series{Name: "stock Watermill, tuned", Unit: "msg/s"}
	stockDef := series{Name: "stock Watermill, defaults", Unit: "msg/s"}
	profile, err := openProfile(c.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer profile.close()
	for rep := 1; rep <= c.reps; rep++ {
		r, err := drainRaw(ctx, c, rep)
		if err != nil {
			return nil, fmt.Errorf("raw drain: %w", err)
		}
		raw.add(r)
		var o float64
		err = profile.during(rep == 1, func() (err error) { o, err = drainOutboxkit(ctx, c, pool, rep); return err })
		if err != nil {
			return nil, fmt.Errorf("outboxkit drain: %w", err)
		}
		ours.add(o)
		s, err := drainStock(ctx, c, stockPostgres(pool), rep, stockTuned)
		if err != nil {
			return nil, fmt.Errorf("stock drain: %w", err)
		}
		stock.add(s)
		d, err := drainStock(ctx, c, stockPostgres(pool), rep, stockDefaults)
		if err != nil {
			return nil, fmt.Errorf("stock drain: %w", err)
		}
		stockDef.add(d)
		fmt.Printf("  round %d: raw %.0f, outboxkit %.0f, stock tuned %.0f, stock defaults %.0f msg/s\n", rep, r, o, s, d)
	}
	vsStock := ratio("outboxkit / stock tuned", ours, stock)
	vsStockDef := ratio("outboxkit / stock defaults", ours, stockDef)
	vsRaw := ratio("outboxkit / raw broker", ours, raw)
	fmt.Print(table("drain rate", []series{raw, ours, stock, stockDef}))
	fmt.Print(table("ratios, paired by round", []series{vsStock, vsStockDef, vsRaw}))
	return []series{raw, ours, stock, stockDef, vsStock, vsStockDef, vsRaw}, nil
}

// counter consumes a fresh queue bound to topic's exchange and reports when n messages arrived.
type counter struct {
	conn     *amqp.Connection
	queue    string
	topic    string
	n        int
	got      atomic.Int64
	done     chan struct{}
	orderErr atomic.Value
}

func newCounter(url, topic string, n int) (*counter, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	c := &counter{conn: conn, queue: topic + "_bench", topic: topic, n: n, done: make(chan struct{})}
	if err := ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
		return nil, err
	}
	if _, err := ch.QueueDeclare(c.queue, true, false, false, false, nil); err != nil {
		return nil, err
	}
	if err := ch.QueueBind(c.queue, "", topic, false, nil); err != nil {
		return nil, err
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(c.queue, "", true, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		last := map[string]int64{}
		for d := range deliveries {
			if seq, err := strconv.ParseInt(fmt.Sprint(d.Headers[outboxkit.MetadataSeq]), 10, 64); err == nil {
				key := fmt.Sprint(d.Headers[outboxkit.MetadataPartitionKey])
				if seq < last[key] {
					c.orderErr.Store(fmt.Errorf("key %s: seq %d after %d", key, seq, last[key]))
				}
				last[key] = seq
			}
			if c.got.Add(1) == int64(n) {
				close(c.done)
			}
		}
	}()
	return c, nil
}

func (c *counter) wait(ctx context.Context, within time.Duration) error {
	if err := waitFor(ctx, c.done, within, func() error {
		return fmt.Errorf("only %d of %d messages arrived within %s", c.got.Load(), c.n, within)
	}); err != nil {
		return err
	}
	if err, _ := c.orderErr.Load().(error); err != nil {
		return fmt.Errorf("per-key order broken: %w", err)
	}
	return nil
}

func (c *counter) close() {
	if ch, err := c.conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(c.queue, false, false, false)
		_ = ch.ExchangeDelete(c.topic, false, false)
	}
	_ = c.conn.Close()
}

func payload(i, keys int) ([]byte, string) {
	key := fmt.Sprintf("order-%04d", i%keys)
	return []byte(fmt.Sprintf(`{"order_id":%q,"n":%d,"customer":"customer-%d","total_cents":%d}`, key, i, i%97, i*7)), key
}

// drainRaw publishes the events straight to the broker: persistent, confirmed, many in flight.
func drainRaw(ctx context.Context, c config, rep int) (float64, error) {
	topic := fmt.Sprintf("bench.raw.%d.%d", rep, time.Now().UnixNano())
	cnt, err := newCounter(c.brokerURL, topic, c.events)
	if err != nil {
		return 0, err
	}
	defer cnt.close()
	conn, err := amqp.Dial(c.brokerURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	const window = 512
	start := time.Now()
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	for i := 0; i < c.events; i++ {
		body, _ := payload(i, c.keys)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topic, "", false, false,
			amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(i)})
		if err != nil {
			return 0, err
		}
		pending = append(pending, dc)
		if len(pending) == window {
			for _, p := range pending {
				if !p.Wait() {
					return 0, errors.New("broker nacked a message")
				}
			}
			pending = pending[:0]
		}
	}
	for _, p := range pending {
		if !p.Wait() {
			return 0, errors.New("broker nacked a message")
		}
	}
	if err := cnt.wait(ctx, 5*time.Minute); err != nil {
		return 0, err
	}
	return rate(c.events, time.Since(start)), nil
}

// drainOutboxkit preloads the outbox, then times a forwarder draining it.
func drainOutboxkit(ctx context.Context, c config, pool *pgxpool.Pool, rep int) (float64, error) {
	schema, drop, err := newSchema(ctx, pool, fmt.Sprintf("bench_outboxkit_%d", rep))
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := "bench.outboxkit." + schema
	if err := preloadOutboxkit(ctx, pool, schema, topic, c, quietRows); err != nil {
		return 0, err
	}
	cnt, err := newCounter(c.brokerURL, topic, c.events)
	if err != nil {
		return 0, err
	}
	defer cnt.close()
	drain := timedDrain{events: c.events, arrived: func() error { return cnt.wait(ctx, 5*time.Minute) }}
	for i := range max(1, c.relays) {
		pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
		if err != nil {
			return 0, err
		}
		defer pub.Close()
		relay, err := drainRelay(c, storeIn(pool, schema, pgxstore.Config{}), pub, fmt.Sprint("bench-", i))
		if err != nil {
			return 0, err
		}
		drain.run = append(drain.run, relay.Run)
	}
	return drain.rate(ctx)
}

// preloadOutboxkit writes c.events events into the outbox in schema, in transactions of 1,000,
// through a store of cfg (its schema is set here): rows, or with cfg.WAL logical decoding
// messages. Writers wake nobody unless cfg asks them to.
func preloadOutboxkit(ctx context.Context, pool *pgxpool.Pool, schema, topic string, c config, cfg pgxstore.Config) error {
	st := storeIn(pool, schema, cfg)
	return preloadEvents(c, func(msgs []*message.Message) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	})
}

// quietRows is the preload's store config for the polling relay: rows, no NOTIFY.
var quietRows = pgxstore.Config{DisableNotify: true}

// stockSQL is where stock Watermill keeps its topic: watermill-sql's schema and offsets adapters
// for a database, and how to drop a topic's tables.
type stockSQL struct {
	name     string
	beginner wsql.Beginner
	schema   func(batchSize int) wsql.SchemaAdapter
	offsets  wsql.OffsetsAdapter
	drop     func(fwdTopic string)
}

func stockPostgres(pool *pgxpool.Pool) stockSQL {
	return stockSQL{
		name:     "postgres",
		beginner: wsql.BeginnerFromPgx(pool),
		schema:   func(n int) wsql.SchemaAdapter { return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: n} },
		offsets:  wsql.DefaultPostgreSQLOffsetsAdapter{},
		drop: func(t string) {
			_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s", "watermill_offsets_%s"`, t, t))
		},
	}
}

// drainStock preloads a watermill-sql topic through Watermill's forwarder publisher (the envelope
// its forwarder expects), then times Watermill's forwarder draining it to watermill-amqp.
func drainStock(ctx context.Context, c config, db stockSQL, rep int, tuning stockTuning) (float64, error) {
	suffix := fmt.Sprintf("%s_%s_%d_%d", db.name, tuning.name, rep, time.Now().UnixNano()%1e9)
	fwdTopic := "bench_stock_" + suffix
	topic := "bench.stock." + suffix
	logger := watermill.NopLogger{}
	schemaAdapter := db.schema(tuning.batchSize)
	defer db.drop(fwdTopic)

	sqlPub, err := wsql.NewPublisher(db.beginner, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger)
	if err != nil {
		return 0, err
	}
	envelopes := wforwarder.NewPublisher(sqlPub, wforwarder.PublisherConfig{ForwarderTopic: fwdTopic})
	if err := preloadEvents(c, func(msgs []*message.Message) error { return envelopes.Publish(topic, msgs...) }); err != nil {
		return 0, err
	}

	cnt, err := newCounter(c.brokerURL, topic, c.events)
	if err != nil {
		return 0, err
	}
	defer cnt.close()
	amqpCfg := wamqp.NewDurablePubSubConfig(c.brokerURL, nil)
	amqpCfg.Publish.ConfirmDelivery = true
	amqpCfg.Publish.ChannelPoolSize = tuning.channelPool
	amqpPub, err := wamqp.NewPublisher(amqpCfg, logger)
	if err != nil {
		return 0, err
	}
	defer amqpPub.Close()
	sub, err := wsql.NewSubscriber(db.beginner, wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		PollInterval:     tuning.pollInterval,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   db.offsets,
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return 0, err
	}
	fwd, err := wforwarder.NewForwarder(sub, amqpPub, logger, wforwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		return 0, err
	}
	return timedDrain{
		events:  c.events,
		run:     []func(context.Context) error{fwd.Run},
		stop:    func() { _ = fwd.Close() },
		arrived: func() error { return cnt.wait(ctx, 10*time.Minute) },
	}.rate(ctx)
}
