package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// benchScale times the drain with 1, 2 and 4 forwarders on one outbox, rounds alternating.
func benchScale(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	fmt.Printf("\nscale: %d preloaded events over %d keys → RabbitMQ, drained by 1, 2 and 4 forwarders, %d reps\n", c.events, c.keys, c.reps)
	counts := []int{1, 2, 4}
	all := make([]series, len(counts))
	for i, n := range counts {
		all[i] = series{Name: fmt.Sprintf("%d forwarder(s)", n), Unit: "msg/s"}
	}
	for rep := 1; rep <= c.reps; rep++ {
		for i, n := range counts {
			cc := c
			cc.relays = n
			r, err := drainOutboxkit(ctx, cc, pool, rep)
			if err != nil {
				return nil, fmt.Errorf("%d forwarders: %w", n, err)
			}
			all[i].add(r)
		}
		fmt.Printf("  round %d: 1: %.0f, 2: %.0f, 4: %.0f msg/s\n", rep, all[0].Values[rep-1], all[1].Values[rep-1], all[2].Values[rep-1])
	}
	rows := append(all, ratio("2 / 1 forwarders", all[1], all[0]), ratio("4 / 1 forwarders", all[2], all[0]))
	fmt.Print(table("drain rate by forwarder count", rows))
	return rows, nil
}

// discard is a broker that takes everything at once: the claim is what is timed.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// claimWarmup passes run untimed on each outbox before the timed ones.
const claimWarmup = 3

// benchClaim times one DispatchBatch of a small pending set while the outbox holds 0, 1 M and
// 5 M published rows: the pending index must keep the claim flat as history grows. Each history
// size has an outbox (a schema) of its own, and the timed passes go round the outboxes, so every
// size sees the same machine at the same moments.
func benchClaim(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	fmt.Printf("\nclaim cost: one DispatchBatch of %d pending rows (%d keys), broker discarding, as published history grows; %d samples each\n",
		c.claimPending, min(c.keys, c.claimPending), c.claimSamples)
	relays := make([]*forwarder.Forwarder, len(c.claimHistory))
	schemas := make([]string, len(c.claimHistory))
	for i, history := range c.claimHistory {
		schema, drop, err := newSchema(ctx, pool, fmt.Sprintf("bench_claim_%d", i))
		if err != nil {
			return nil, err
		}
		defer drop()
		schemas[i] = schema
		if history > 0 {
			fmt.Printf("  loading %s published rows…\n", humanCount(history))
			// History as the relay leaves it: published, keyed, with a realistic payload. (A uuid
			// and an untyped '{}' fit every schema version's columns.)
			if _, err := pool.Exec(ctx, `INSERT INTO `+schemas[i]+`.outbox (uuid, topic, partition_key, payload, metadata, created_at, published_at, attempts)
				SELECT md5('h-' || g)::uuid, 'orders', 'order-' || (g % 5000), convert_to(repeat('x', 120), 'UTF8'), '{}',
					now() - interval '1 day', now() - interval '1 day', 1
				FROM generate_series(1, $1::bigint) AS g`, history); err != nil {
				return nil, err
			}
		}
		// As autovacuum would have by then: the published rows' entries gone from the pending
		// index, statistics current.
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+schemas[i]+`.outbox`); err != nil {
			return nil, err
		}
		relays[i], err = forwarder.New(forwarder.Config{Store: storeIn(pool, schemas[i], pgxstore.Config{}), Publisher: discard{}, Name: "claim",
			BatchSize: c.claimPending, Retention: forwarder.Retention{Keep: true}})
		if err != nil {
			return nil, err
		}
	}
	rows := make([]series, len(c.claimHistory))
	for i, history := range c.claimHistory {
		rows[i] = series{Name: fmt.Sprintf("claim + publish + mark of %d rows, %s published rows", c.claimPending, humanCount(history)), Unit: "ms"}
	}
	for sample := range c.claimSamples + claimWarmup {
		for i, relay := range relays {
			if err := insertPending(ctx, pool, schemas[i], c.claimPending, c.keys); err != nil {
				return nil, err
			}
			t0 := time.Now()
			res, err := relay.DispatchBatch(ctx)
			if err != nil {
				return nil, err
			}
			d := time.Since(t0)
			if res.Published != c.claimPending {
				return nil, fmt.Errorf("a pass published %d rows, want %d", res.Published, c.claimPending)
			}
			if sample >= claimWarmup {
				rows[i].add(ms(d))
			}
		}
	}
	for i := 1; i < len(c.claimHistory); i++ {
		rows = append(rows, series{Name: fmt.Sprintf("change at %s vs %s published rows", humanCount(c.claimHistory[i]), humanCount(c.claimHistory[0])),
			Unit: "%", Values: []float64{100 * (rows[i].median()/rows[0].median() - 1)}})
	}
	fmt.Print(table("claim cost", rows))
	return rows, nil
}

func insertPending(ctx context.Context, pool *pgxpool.Pool, schema string, n, keys int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	pub, err := pipeline.NewPublisher(storeIn(pool, schema, pgxstore.Config{DisableNotify: true}), tx, pipeline.PublisherConfig{})
	if err != nil {
		return err
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		body, key := payload(i, keys)
		msgs[i] = pipeline.NewEvent("OrderPlaced", key, body)
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func humanCount(n int) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%g M", float64(n)/1e6)
	case n >= 1000:
		return fmt.Sprintf("%g k", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
