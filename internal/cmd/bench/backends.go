package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/topics"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// defaultBackendURLs are the local services scripts/services.sh starts.
const defaultBackendURLs = "amqp://guest:guest@127.0.0.1:5672/,kafka://127.0.0.1:9092,nats://127.0.0.1:4222," +
	"redis://127.0.0.1:6379/0,postgres://postgres@127.0.0.1:5432/test?sslmode=disable,memory://"

// benchBackends times the forwarder draining the same preloaded outbox to each backend, as
// backends.Open builds it, in one run: rounds alternate between backends so that drift of the
// machine hits them alike.
func benchBackends(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	urls := strings.Split(c.backendURLs, ",")
	fmt.Printf("\ndrain to each backend: %d preloaded events over %d keys, outboxkit forwarder with defaults, %d reps\n",
		c.events, c.keys, c.reps)
	all := make([]series, len(urls))
	for i, u := range urls {
		all[i] = series{Name: "forwarder → " + strings.SplitN(u, ":", 2)[0], Unit: "msg/s"}
	}
	for rep := 1; rep <= c.reps; rep++ {
		var line []string
		for i, u := range urls {
			r, err := drainBackend(ctx, c, pool, u, rep)
			if err != nil {
				return nil, fmt.Errorf("drain to %s: %w", all[i].Name, err)
			}
			all[i].add(r)
			line = append(line, fmt.Sprintf("%s %.0f", strings.TrimPrefix(all[i].Name, "forwarder → "), r))
		}
		fmt.Printf("  round %d: %s msg/s\n", rep, strings.Join(line, ", "))
	}
	fmt.Print(table("forwarder drain rate per backend", all))
	return all, nil
}

// countingPublisher counts the messages the broker accepted and says when n were.
type countingPublisher struct {
	message.Publisher
	n    int64
	got  atomic.Int64
	once sync.Once
	done chan struct{}
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.got.Add(int64(len(msgs))) >= p.n {
		p.once.Do(func() { close(p.done) })
	}
	return nil
}

func drainBackend(ctx context.Context, c config, pool *pgxpool.Pool, url string, rep int) (float64, error) {
	scheme := strings.SplitN(url, ":", 2)[0]
	schema, drop, err := newSchema(ctx, pool, fmt.Sprintf("bench_%s_%d", scheme, rep))
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := schema + ".placed"
	if err := preloadOutboxkit(ctx, pool, schema, topic, c, quietRows); err != nil {
		return 0, err
	}
	b, err := backends.Open(ctx, url, backends.Options{})
	if err != nil {
		return 0, err
	}
	defer b.Close()
	defer topics.Remove(url, scheme, topic, topic+"_bench")
	if scheme == "amqp" {
		// Mandatory publishing needs a queue bound to the topic, as a consumer group would have.
		sub, err := b.NewSubscriber("bench")
		if err != nil {
			return 0, err
		}
		if err := sub.(message.SubscribeInitializer).SubscribeInitialize(topic); err != nil {
			return 0, err
		}
		_ = sub.Close()
	}
	pub := &countingPublisher{Publisher: b.Publisher, n: int64(c.events), done: make(chan struct{})}
	outbox := storeIn(pool, schema, pgxstore.Config{})
	relay, err := forwarder.New(forwarder.Config{Store: outbox, Publisher: pub, Name: "bench",
		BatchSize: c.batch, MaxInFlight: c.inFlight, Retention: forwarder.Retention{Keep: true}})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); _ = relay.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-pub.done:
	case <-time.After(5 * time.Minute):
		return 0, fmt.Errorf("only %d of %d events published within 5m", pub.got.Load(), c.events)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	for { // published is not drained until the rows are marked
		s, err := outbox.OutboxStats(ctx, time.Now())
		if err != nil {
			return 0, err
		}
		if s.Pending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return rate(c.events, time.Since(start)), nil
}
