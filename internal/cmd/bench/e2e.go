package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
