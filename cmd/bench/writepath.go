package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// writeMode is what one business transaction does.
type writeMode struct {
	name   string
	outbox bool // the event row too
	notify bool // and the NOTIFY that wakes the relay (skipped while a relay says it is awake)
	// relayPoll, when set, runs a relay draining the outbox (to a publisher that discards) during
	// the measurement; with notify, its poll under the wake-ups.
	relayPoll time.Duration
}

var writeModes = []writeMode{
	{name: "business tx alone"},
	{name: "+ outbox row", outbox: true},
	{name: "+ outbox row + NOTIFY", outbox: true, notify: true},
	{name: "+ outbox row, relay polling every 20ms", outbox: true, relayPoll: 20 * time.Millisecond},
	{name: "+ outbox row + NOTIFY, relay running", outbox: true, notify: true, relayPoll: forwarder.DefaultPollInterval},
}

// benchWritePath times the business transaction (insert an order, commit) alone and with its
// outbox row, at 1, 4 and 16 concurrent clients, for c.writeFor each. Modes alternate within a
// round, so each ratio pairs figures measured back to back.
func benchWritePath(ctx context.Context, c config) ([]series, error) {
	cfg, err := pgxpool.ParseConfig(c.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	schema, drop, err := newSchema(ctx, pool, "bench_write")
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	fmt.Printf("\nwrite path: INSERT an order and COMMIT, alone and with its outbox row; %s per measurement, %d reps\n", c.writeFor, c.reps)

	clients := []int{1, 4, 16}
	type key struct{ mode, clients int }
	p50, p99, tps := map[key]*series{}, map[key]*series{}, map[key]*series{}
	for mi, m := range writeModes {
		for _, n := range clients {
			k := key{mi, n}
			p50[k] = &series{Name: fmt.Sprintf("%s, %d clients, p50", m.name, n), Unit: "ms"}
			p99[k] = &series{Name: fmt.Sprintf("%s, %d clients, p99", m.name, n), Unit: "ms"}
			tps[k] = &series{Name: fmt.Sprintf("%s, %d clients", m.name, n), Unit: "tx/s"}
		}
	}
	for rep := 1; rep <= c.reps; rep++ {
		for _, n := range clients {
			for mi, m := range writeModes {
				lat, elapsed, err := writeLoad(ctx, pool, schema, m, n, c.writeFor)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", m.name, err)
				}
				k := key{mi, n}
				p50[k].add(ms(percentile(lat, 50)))
				p99[k].add(ms(percentile(lat, 99)))
				tps[k].add(rate(len(lat), elapsed))
			}
		}
		fmt.Printf("  round %d done\n", rep)
	}
	var lat, thr, over []series
	for _, n := range clients {
		for mi := range writeModes {
			k := key{mi, n}
			lat = append(lat, *p50[k], *p99[k])
			thr = append(thr, *tps[k])
		}
		base := key{0, n}
		for mi := 1; mi < len(writeModes); mi++ {
			k := key{mi, n}
			over = append(over, overhead(fmt.Sprintf("%s, %d clients: p50 cost", writeModes[mi].name, n), *p50[k], *p50[base]))
		}
	}
	fmt.Print(table("write path latency", lat))
	fmt.Print(table("write path throughput", thr))
	fmt.Print(table("outbox cost on the business tx, paired by round", over))
	// The price of waking the relay, with a relay draining in both: NOTIFY (skipped while the
	// relay says it is awake) against no NOTIFY and a 20ms poll.
	var notifyCost []series
	for _, n := range clients {
		notifyCost = append(notifyCost, ratio(fmt.Sprintf("NOTIFY / no NOTIFY, relay running, %d clients, tx/s", n),
			*tps[key{4, n}], *tps[key{3, n}]))
	}
	fmt.Print(table("waking the relay, paired by round", notifyCost))
	return slices.Concat(lat, thr, over, notifyCost), nil
}

// writeLoad runs n clients, each committing transactions back to back for d; it returns every
// transaction's latency.
func writeLoad(ctx context.Context, pool *pgxpool.Pool, schema string, m writeMode, n int, d time.Duration) ([]time.Duration, time.Duration, error) {
	var (
		mu   sync.Mutex
		all  []time.Duration
		errs = make(chan error, n)
		wg   sync.WaitGroup
	)
	insert := `INSERT INTO ` + schema + `.orders (customer, total_cents) VALUES ($1, $2) RETURNING id`
	outbox := storeIn(pool, schema, pgxstore.Config{DisableNotify: !m.notify})
	if m.relayPoll > 0 {
		relay, err := forwarder.New(forwarder.Config{Store: storeIn(pool, schema, pgxstore.Config{}), Publisher: discard{},
			Name: "write", PollInterval: m.relayPoll, Retention: forwarder.Retention{Keep: true}})
		if err != nil {
			return nil, 0, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = relay.Run(rctx) }()
		defer func() { cancel(); <-done }()
		if err := started(relay.Running(), "relay"); err != nil {
			return nil, 0, err
		}
	}
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; time.Now().Before(deadline); i++ {
				t0 := time.Now()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var id int64
					if err := tx.QueryRow(ctx, insert, fmt.Sprintf("customer-%d", w), i).Scan(&id); err != nil {
						return err
					}
					if !m.outbox {
						return nil
					}
					pub, err := pipeline.NewPublisher(outbox, tx, pipeline.PublisherConfig{})
					if err != nil {
						return err
					}
					body, key := payload(int(id), 200)
					return pub.Publish("orders", pipeline.NewEvent("OrderPlaced", key, body))
				}); err != nil {
					errs <- err
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		return nil, 0, err
	default:
	}
	return all, elapsed, nil
}
