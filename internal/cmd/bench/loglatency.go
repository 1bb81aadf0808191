package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The relays the log scenario's end-to-end part compares, each with the batch consumer (one
// consumer group, unsharded) on the same broker and the same database.
var logE2EImpls = []e2eImpl{
	{name: "polling relay", batched: true, probe: true},
	{name: "log relay, table mode", batched: true, log: "table", probe: true},
	{name: "log relay, wal mode", batched: true, log: "wal", probe: true},
}

// logLatency runs the e2e scenario's measurement (e2eOnce) on the logical cluster for the polling
// relay and the log relay in both modes: p50/p99 from COMMIT returned to the consumer's effect
// committed at 1,000 msg/s, the statements the relay runs per event meanwhile, and the highest
// offered rate with p99 < 100 ms.
func logLatency(ctx context.Context, c config, _ *pgxpool.Pool) ([]series, error) {
	pool, err := e2ePool(ctx, c.logDBURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	const at = 1000
	fmt.Printf("\nlog, end to end: COMMIT returned → batch consumer's effect committed, RabbitMQ between, %d msg/s offered by 16 writers, %s a run, %d reps, on %s\n",
		at, c.e2eFor, c.reps, c.logDBURL)
	type figs struct{ p50, p95, p99, max, d50, d99, written, stmts series }
	by := make([]figs, len(logE2EImpls))
	for i, impl := range logE2EImpls {
		name := fmt.Sprintf("%s at %d msg/s", impl.name, at)
		by[i] = figs{p50: series{Name: name + ", p50", Unit: "ms"}, p95: series{Name: name + ", p95", Unit: "ms"},
			p99: series{Name: name + ", p99", Unit: "ms"}, max: series{Name: name + ", max", Unit: "ms"},
			d50: series{Name: name + ", delivered to a raw consumer, p50", Unit: "ms"}, d99: series{Name: name + ", delivered to a raw consumer, p99", Unit: "ms"},
			written: series{Name: name + ", written", Unit: "msg/s"}, stmts: series{Name: name + ", relay statements/event", Unit: ""}}
	}
	profile, err := openProfile(c.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer profile.close()
	for rep := 1; rep <= c.reps; rep++ {
		for i, impl := range logE2EImpls {
			// --cpuprofile: the whole process (writers, relay, consumer) in the first round in WAL mode.
			var res e2eResult
			err := profile.during(rep == 1 && impl.log == "wal", func() (err error) {
				res, err = e2eOnce(ctx, c, pool, impl, at, c.e2eFor)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s at %d msg/s: %w", impl.name, at, err)
			}
			f := &by[i]
			f.p50.add(ms(percentile(res.latencies, 50)))
			f.p95.add(ms(percentile(res.latencies, 95)))
			f.p99.add(ms(percentile(res.latencies, 99)))
			f.max.add(ms(percentile(res.latencies, 100)))
			f.d50.add(ms(percentile(res.delivered, 50)))
			f.d99.add(ms(percentile(res.delivered, 99)))
			f.written.add(res.written)
			f.stmts.add(res.relayStmts)
			note := ""
			if res.missing > 0 {
				note = fmt.Sprintf(" (%d effects still missing when the run gave up)", res.missing)
			}
			fmt.Printf("  round %d: %s (written %.0f/s): effect p50 %.1f ms, p99 %.1f ms; delivered p50 %.1f ms, p99 %.1f ms; relay statements %.4f/event%s\n",
				rep, impl.name, res.written, ms(percentile(res.latencies, 50)), ms(percentile(res.latencies, 99)),
				ms(percentile(res.delivered, 50)), ms(percentile(res.delivered, 99)), res.relayStmts, note)
		}
	}
	var rows, ratios []series
	for _, f := range by {
		rows = append(rows, f.p50, f.p95, f.p99, f.max, f.d50, f.d99, f.written, f.stmts)
	}
	for i := 1; i < len(by); i++ {
		ratios = append(ratios,
			ratio(fmt.Sprintf("%s p50 / polling p50", logE2EImpls[i].name), by[i].p50, by[0].p50),
			ratio(fmt.Sprintf("%s p99 / polling p99", logE2EImpls[i].name), by[i].p99, by[0].p99))
	}
	fmt.Print(table("log, end-to-end latency", rows))
	fmt.Print(table("log, end-to-end latency, paired by round", ratios))
	best, err := e2eMaxRate(ctx, c, pool, logE2EImpls, []int{250, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 8000})
	if err != nil {
		return nil, err
	}
	return slices.Concat(rows, ratios, best), nil
}

// The writers' modes the log scenario compares: the business transaction alone; with the polling
// relay's outbox row and its NOTIFY (the default store); with the row and no NOTIFY (the log
// relay in table mode), by Publish then Commit and sent with the COMMIT; and with a logical
// decoding message (the log relay in WAL mode), by Publish then Commit and sent with the COMMIT.
var logWriteModes = []writeMode{
	{key: "alone", name: modeAlone},
	{key: "notify", name: "+ outbox row + NOTIFY (polling relay)", outbox: true, notify: true},
	{key: "table", name: "+ outbox row, no NOTIFY (log, table)", outbox: true},
	{key: "table-transact", name: "+ outbox row sent with COMMIT (log, table, Transact)", outbox: true, withCommit: true},
	{key: "wal", name: "+ WAL message (log, wal)", outbox: true, wal: true},
	{key: "wal-transact", name: "+ WAL message sent with COMMIT (log, wal, Transact)", outbox: true, wal: true, withCommit: true},
}

// logWriteCost times the business transaction (INSERT an order, COMMIT) alone and with its event
// in each writer mode, at 1, 4 and 16 clients, on the logical cluster, no relay running (every
// polling writer notifies); modes alternate within a round. Its ratios are each mode's time per
// transaction over the business transaction's alone, paired by round.
func logWriteCost(ctx context.Context, c config, _ *pgxpool.Pool) ([]series, error) {
	target, err := pgWriteTarget(ctx, c, c.logDBURL, logWriteModes)
	if err != nil {
		return nil, err
	}
	defer target.close()
	fmt.Printf("\nlog, writers' cost on %s: INSERT an order and COMMIT, alone and with its event in each mode; %s per measurement, %d reps\n",
		c.logDBURL, c.writeFor, c.reps)
	clients := []int{1, 4, 16}
	fig, err := measureWrites(ctx, c, target, logWriteModes, clients, nil, "")
	if err != nil {
		return nil, err
	}
	notify := slices.IndexFunc(logWriteModes, func(m writeMode) bool { return m.key == "notify" })
	var lat, thr, cost []series
	for _, n := range clients {
		for mi := range logWriteModes {
			k := writeKey{mi, n}
			lat = append(lat, *fig.p50[k], *fig.p99[k])
			thr = append(thr, *fig.tps[k])
		}
		alone := fig.tps[writeKey{0, n}]
		for mi := 1; mi < len(logWriteModes); mi++ {
			// Time per transaction over the business transaction's: the inverse of throughput.
			cost = append(cost, ratio(fmt.Sprintf("%s ÷ alone, %d clients", logWriteModes[mi].name, n), *alone, *fig.tps[writeKey{mi, n}]))
		}
		for mi := range logWriteModes {
			if m := logWriteModes[mi]; m.key != "alone" && m.key != "notify" {
				cost = append(cost, ratio(fmt.Sprintf("%s ÷ polling row + NOTIFY, %d clients", m.name, n),
					*fig.tps[writeKey{notify, n}], *fig.tps[writeKey{mi, n}]))
			}
		}
	}
	fmt.Print(table("log, writers' latency", lat))
	fmt.Print(table("log, writers' throughput", thr))
	fmt.Print(table("log, writers' time per transaction, paired by round (below 1: cheaper)", cost))
	return slices.Concat(lat, thr, cost), nil
}
