package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
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
	pub := newCountingPublisher(b.Publisher, c.events)
	outbox := storeIn(pool, schema, pgxstore.Config{})
	return drainMarked(ctx, c, outbox, pub, func() error { return pub.wait(ctx, 5*time.Minute) })
}
