package main

import (
	"context"
	"fmt"
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

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

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
	defer func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s", "watermill_offsets_%s"`, fwdTopic, fwdTopic))
	}()
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
