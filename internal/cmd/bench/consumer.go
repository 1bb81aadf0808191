package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

const (
	consumerShards = 4
	consumerBatch  = 100
)

// consumerKind is one consumer the scenario measures, into s.
type consumerKind struct {
	s      *series
	kind   string
	shards int
}

// benchConsumer times consumers draining a preloaded queue, each writing one effect row per
// message: stock Watermill as shipped, a plain handler with our subscriber settings (the baseline
// for the inbox's cost), the inbox stack, and the inbox stack over key shards.
func benchConsumer(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	schema, drop, err := newSchema(ctx, pool, "bench_consumer")
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.effects (message_id text NOT NULL, note text)`); err != nil {
		return nil, err
	}
	n := c.consumerEvents
	fmt.Printf("\nconsumer on %s: %d preloaded messages, one effect row each (one transaction per message), %d reps\n",
		brokerScheme(c.brokerURL), n, c.reps)

	stock := series{Name: "stock Watermill consumer, as shipped", Unit: "msg/s"}
	plain := series{Name: "plain handler, outboxkit subscriber", Unit: "msg/s"}
	inboxOnly := series{Name: "inbox alone (no delivery count)", Unit: "msg/s"}
	inbox := series{Name: "outboxkit inbox stack", Unit: "msg/s"}
	guarded := series{Name: "outboxkit inbox stack + order guard, in order", Unit: "msg/s"}
	sharded := series{Name: fmt.Sprintf("outboxkit inbox stack, %d key shards", consumerShards), Unit: "msg/s"}
	plainBatched := series{Name: fmt.Sprintf("plain handler, batches of up to %d", consumerBatch), Unit: "msg/s"}
	batched := series{Name: fmt.Sprintf("outboxkit batch consumer, up to %d", consumerBatch), Unit: "msg/s"}
	batchedSharded := series{Name: fmt.Sprintf("outboxkit batch consumer, %d key shards", consumerShards), Unit: "msg/s"}
	kinds := []consumerKind{{&stock, "stock", 1}, {&plain, "plain", 1}, {&inboxOnly, "inbox-only", 1}, {&inbox, "inbox", 1},
		{&guarded, "guarded", 1}, {&sharded, "inbox", consumerShards}, {&plainBatched, "plain-batched", 1}, {&batched, "batched", 1},
		{&batchedSharded, "batched", consumerShards}}
	if c.consumerKinds != "" {
		want := map[string]bool{}
		for _, k := range strings.Split(c.consumerKinds, ",") {
			want[strings.TrimSpace(k)] = true
		}
		kinds = slices.DeleteFunc(kinds, func(k consumerKind) bool { return !want[k.kind] })
		if len(kinds) == 0 {
			return nil, fmt.Errorf("--consumer-kinds %q: name some of stock, plain, inbox-only, inbox, guarded, plain-batched, batched", c.consumerKinds)
		}
	}
	for rep := 1; rep <= c.reps; rep++ {
		line := fmt.Sprintf("  round %d:", rep)
		for _, v := range kinds {
			r, err := consumeOnce(ctx, c, pool, schema, v.kind, v.shards, rep)
			if err != nil {
				return nil, fmt.Errorf("%s consumer: %w", v.s.Name, err)
			}
			v.s.add(r)
			line += fmt.Sprintf(" %s %.0f,", v.s.Name, r)
		}
		fmt.Println(strings.TrimSuffix(line, ",") + " msg/s")
	}
	if c.consumerKinds != "" {
		var out []series
		for _, v := range kinds {
			out = append(out, *v.s)
		}
		if len(inbox.Values) > 0 && len(guarded.Values) > 0 {
			out = append(out, ratio("inbox stack + order guard / inbox stack", guarded, inbox))
		}
		if len(batched.Values) > 0 && len(stock.Values) > 0 {
			out = append(out, ratio("batch consumer / stock", batched, stock))
		}
		if len(batched.Values) > 0 && len(plainBatched.Values) > 0 {
			out = append(out, ratio("batch consumer / plain handler batched", batched, plainBatched))
		}
		fmt.Print(table("consumer rate", out))
		return out, nil
	}
	overhead := series{Name: "inbox stack cost vs plain handler", Unit: "%"}
	inboxCost := series{Name: "inbox alone cost vs plain handler", Unit: "%"}
	for i := range inbox.Values {
		overhead.add(100 * (1 - inbox.Values[i]/plain.Values[i]))
		inboxCost.add(100 * (1 - inboxOnly.Values[i]/plain.Values[i]))
	}
	batchCost := series{Name: "batch consumer cost vs plain handler batched", Unit: "%"}
	for i := range batched.Values {
		batchCost.add(100 * (1 - batched.Values[i]/plainBatched.Values[i]))
	}
	vsStock := ratio("inbox sharded / stock", sharded, stock)
	batchVsStock := ratio("batch consumer / stock", batched, stock)
	guardCost := ratio("inbox stack + order guard / inbox stack", guarded, inbox)
	fmt.Print(table("consumer rate", []series{stock, plain, inboxOnly, inbox, guarded, sharded, plainBatched, batched, batchedSharded}))
	fmt.Print(table("paired by round", []series{inboxCost, overhead, guardCost, vsStock, ratio("inbox stack / stock", inbox, stock),
		batchVsStock, batchCost, ratio("batch consumer sharded / stock", batchedSharded, stock)}))
	return []series{stock, plain, inboxOnly, inbox, guarded, sharded, plainBatched, batched, batchedSharded, inboxCost, overhead,
		guardCost, vsStock, batchVsStock, batchCost}, nil
}

func consumeOnce(ctx context.Context, c config, pool *pgxpool.Pool, schema, kind string, shards, rep int) (float64, error) {
	n := c.consumerEvents
	scheme := brokerScheme(c.brokerURL)
	// No dots: stock watermill-nats names a topic's stream after the topic, which cannot hold one.
	topic := fmt.Sprintf("bench_consume_%s_%d_%d", strings.ReplaceAll(kind, "-", "_"), rep, time.Now().UnixNano()%1e9)
	group := "bench"
	topics := outboxkit.ShardTopics(topic, shards)
	batching := kind == "batched" || kind == "plain-batched"
	var broker *brokerSubscribers
	if scheme == "amqp" {
		if err := declareQueues(c.brokerURL, topics, group); err != nil {
			return 0, err
		}
		defer deleteQueues(c.brokerURL, topics, group)
	} else {
		b, err := openBrokerSubscribers(ctx, c.brokerURL, batching)
		if err != nil {
			return 0, err
		}
		defer b.close(topics)
		broker = b
	}

	var pub message.Publisher
	if broker != nil {
		pub = broker.backend.Publisher
	} else {
		p, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
		if err != nil {
			return 0, err
		}
		defer p.Close()
		pub = p
	}
	versions := map[string]int64{}
	perTopic := map[string][]*message.Message{}
	for i := 0; i < n; i++ {
		body, key := payload(i, c.keys)
		msg := pipeline.NewEvent("OrderPlaced", key, body)
		if kind == "guarded" {
			// Each key's events numbered in the order they are published: the guard applies each
			// at once (nothing parks), so what is measured is its price on every delivery.
			versions[key]++
			outboxkit.SetVersion(msg, versions[key])
		}
		t := outboxkit.ShardTopic(topic, key, shards)
		perTopic[t] = append(perTopic[t], msg)
	}
	for t, msgs := range perTopic {
		for start := 0; start < len(msgs); start += 500 {
			if err := pub.Publish(t, msgs[start:min(start+500, len(msgs))]...); err != nil {
				return 0, err
			}
		}
	}

	var done atomic.Int64
	finished := make(chan struct{})
	count := func() {
		if done.Add(1) == int64(n) {
			close(finished)
		}
	}
	plainEffect := func(msg *message.Message) error {
		if _, err := pool.Exec(msg.Context(), `INSERT INTO `+schema+`.effects (message_id, note) VALUES ($1, $2)`,
			msg.UUID, string(msg.Payload)); err != nil {
			return err
		}
		count()
		return nil
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	var closers []func() error
	var runners []func(context.Context) error // consumers that run without the router
	for _, t := range topics {
		var sub message.Subscriber
		switch {
		case broker != nil && kind == "stock":
			sub, err = broker.stock(group)
		case broker != nil:
			sub, err = broker.backend.NewSubscriber(group)
		case kind == "stock":
			sub, err = wamqp.NewSubscriber(wamqp.NewDurablePubSubConfig(c.brokerURL, wamqp.GenerateQueueNameTopicNameWithSuffix(group)), watermill.NopLogger{})
		case batching:
			sub, err = amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: c.brokerURL, Consumer: group, Unacked: consumerBatch})
		default:
			sub, err = amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: c.brokerURL, Consumer: group})
		}
		if err != nil {
			return 0, err
		}
		closers = append(closers, sub.Close)
		switch kind {
		case "plain-batched":
			runners = append(runners, func(ctx context.Context) error { return plainBatches(ctx, pool, schema, sub, t, count) })
			continue
		case "batched":
			bc, err := middleware.NewBatchConsumer(middleware.BatchConfig{
				StackConfig: middleware.StackConfig{Store: storeIn(pool, schema, pgxstore.Config{}), Consumer: group},
				MaxBatch:    consumerBatch,
			}, sub, t, middleware.NoPublish(handlers.JSON(func(ctx context.Context, tx pgx.Tx, o map[string]any) error {
				msg, _ := handlers.MessageFrom(ctx)
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (message_id, note) VALUES ($1, $2)`, msg.UUID, o["order_id"])
				if err == nil {
					count() // applied in the batch's transaction, committed right after
				}
				return err
			})))
			if err != nil {
				return 0, err
			}
			runners = append(runners, bc.Run)
			continue
		}
		if kind == "stock" || kind == "plain" {
			router.AddConsumerHandler("h-"+t, t, sub, plainEffect)
			continue
		}
		var stack []message.HandlerMiddleware
		if kind == "inbox-only" {
			m, err := middleware.NewInbox(middleware.InboxConfig{Store: storeIn(pool, schema, pgxstore.Config{}), Consumer: group})
			if err != nil {
				return 0, err
			}
			stack = []message.HandlerMiddleware{m}
		} else {
			cfg := middleware.StackConfig{Store: storeIn(pool, schema, pgxstore.Config{}), Consumer: group}
			if kind == "guarded" {
				cfg.OrderGuard = &middleware.OrderGuardConfig{}
			}
			if stack, err = middleware.Stack(cfg); err != nil {
				return 0, err
			}
		}
		h := router.AddConsumerHandler("h-"+t, t, sub, func(msg *message.Message) error {
			err := handlers.JSON(func(ctx context.Context, tx pgx.Tx, o map[string]any) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (message_id, note) VALUES ($1, $2)`, msg.UUID, o["order_id"])
				return err
			})(msg)
			return err
		})
		h.AddMiddleware(append([]message.HandlerMiddleware{func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := next(msg)
				if err == nil {
					count() // acknowledged: processed, or absorbed as a duplicate
				}
				return out, err
			}
		}}, stack...)...)
	}
	if len(runners) == 0 { // else every consumer runs on its own
		runners = []func(context.Context) error{router.Run}
	}
	defer func() {
		for _, cl := range closers {
			_ = cl()
		}
	}()
	return timedDrain{events: n, run: runners, arrived: func() error {
		return waitFor(ctx, finished, 5*time.Minute, func() error { return fmt.Errorf("only %d of %d messages consumed", done.Load(), n) })
	}}.rate(ctx)
}

func declareQueues(url string, topics []string, group string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, t := range topics {
		if err := ch.ExchangeDeclare(t, "fanout", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(t+"_"+group, true, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.QueueBind(t+"_"+group, "", t, false, nil); err != nil {
			return err
		}
	}
	return nil
}

func deleteQueues(url string, topics []string, group string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		for _, t := range topics {
			_, _ = ch.QueueDelete(t+"_"+group, false, false, false)
			_ = ch.ExchangeDelete(t, false, false)
		}
	}
}

// plainBatches is the plain handler batched the way the batch consumer batches: what has arrived
// (up to consumerBatch), one transaction with one effect row each, commit, ack — and no inbox.
func plainBatches(ctx context.Context, pool *pgxpool.Pool, schema string, sub message.Subscriber, topic string, count func()) error {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	for {
		var batch []*message.Message
		select {
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			batch = append(batch, m)
		case <-ctx.Done():
			return nil
		}
	drain:
		for len(batch) < consumerBatch {
			select {
			case m, ok := <-msgs:
				if !ok {
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, m := range batch {
				if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (message_id, note) VALUES ($1, $2)`, m.UUID, string(m.Payload)); err != nil {
					return err
				}
			}
			return nil
		})
		for _, m := range batch {
			if err != nil {
				m.Nack()
				continue
			}
			m.Ack()
			count()
		}
	}
}
