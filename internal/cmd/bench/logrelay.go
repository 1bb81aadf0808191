package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/walmsg"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// benchLog measures the log relay (forwarder/pglog) beside the polling relay, in the same rounds,
// on a server with wal_level = logical (--log-db, scripts/pg-logical.sh), in the parts --log-parts
// names: "drain" (logDrains), "e2e" (logLatency) and "write" (logWriteCost).
func benchLog(ctx context.Context, c config) ([]series, error) {
	pool, err := pgxpool.New(ctx, c.logDBURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return nil, fmt.Errorf("cannot reach Postgres at %s (scripts/pg-logical.sh start): %w", c.logDBURL, err)
	}
	if level != "logical" {
		return nil, fmt.Errorf("%s runs wal_level = %s; the log relay needs logical: point --log-db at scripts/pg-logical.sh's cluster", c.logDBURL, level)
	}
	parts := map[string]func(context.Context, config, *pgxpool.Pool) ([]series, error){
		"drain": logDrains, "e2e": logLatency, "write": logWriteCost, "breakdown": logBreakdown, "floor": logFloor,
	}
	var out []series
	for _, part := range strings.Split(c.logParts, ",") {
		run, ok := parts[strings.TrimSpace(part)]
		if !ok {
			return nil, fmt.Errorf("--log-parts: no part %q; the parts are drain, e2e, write, breakdown and floor", part)
		}
		r, err := run(ctx, c, pool)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}

// logDrains drains the same backlog with the raw broker, the polling relay and the log relay in
// both modes in each round: the drain rate, the database transactions and statements the relay
// runs per event, the WAL bytes per event of the writer and of the relay, the relay's statements
// and CPU when idle, and its peak RSS while relaying one transaction of --big-txn events.
func logDrains(ctx context.Context, c config, pool *pgxpool.Pool) ([]series, error) {
	fmt.Printf("\nlog: %d preloaded events over %d keys → RabbitMQ with publisher confirms, %d reps, on %s\n", c.events, c.keys, c.reps, c.logDBURL)
	raw := series{Name: "raw amqp091, pipelined confirms", Unit: "msg/s"}
	poll := series{Name: "polling relay", Unit: "msg/s"}
	table := series{Name: "log relay, table mode", Unit: "msg/s"}
	wal := series{Name: "log relay, wal mode", Unit: "msg/s"}
	var figs []logFigures
	for rep := 1; rep <= c.reps; rep++ {
		r, err := drainRaw(ctx, c, rep)
		if err != nil {
			return nil, fmt.Errorf("raw drain: %w", err)
		}
		raw.add(r)
		pf, err := logDrain(ctx, c, pool, rep, "poll")
		if err != nil {
			return nil, fmt.Errorf("polling drain: %w", err)
		}
		poll.add(pf.rate)
		tf, err := logDrain(ctx, c, pool, rep, "table")
		if err != nil {
			return nil, fmt.Errorf("log drain, table mode: %w", err)
		}
		table.add(tf.rate)
		wf, err := logDrain(ctx, c, pool, rep, "wal")
		if err != nil {
			return nil, fmt.Errorf("log drain, wal mode: %w", err)
		}
		wal.add(wf.rate)
		figs = append(figs, pf, tf, wf)
		fmt.Printf("  round %d: raw %.0f, polling %.0f, log table %.0f, log wal %.0f msg/s\n", rep, r, pf.rate, tf.rate, wf.rate)
		for _, f := range []logFigures{pf, tf, wf} {
			fmt.Printf("    %-5s writer WAL %.0f B/event, relay WAL %.0f B/event, relay transactions %.4f/event, relay statements %.4f/event, "+
				"idle: %.2f statements/s, CPU %.4f cores\n", f.mode, f.writerWAL, f.relayWAL, f.relayXacts, f.relayStmts, f.idleStmts, f.idleCores)
		}
	}
	out := []series{raw, poll, table, wal,
		ratio("log table / raw broker", table, raw), ratio("log wal / raw broker", wal, raw),
		ratio("log table / polling", table, poll), ratio("log wal / polling", wal, poll)}
	for _, mode := range []string{"poll", "table", "wal"} {
		w := series{Name: mode + ": writer WAL bytes/event", Unit: "B"}
		rw := series{Name: mode + ": relay WAL bytes/event", Unit: "B"}
		x := series{Name: mode + ": relay transactions/event", Unit: ""}
		st := series{Name: mode + ": relay statements/event, after start-up", Unit: ""}
		idleSt := series{Name: mode + ": relay statements/s while idle", Unit: ""}
		idle := series{Name: mode + ": relay CPU idle, cores", Unit: ""}
		for _, f := range figs {
			if f.mode == mode {
				w.add(f.writerWAL)
				rw.add(f.relayWAL)
				x.add(f.relayXacts)
				st.add(f.relayStmts)
				idleSt.add(f.idleStmts)
				idle.add(f.idleCores)
			}
		}
		out = append(out, w, rw, x, st, idleSt, idle)
	}
	for _, mode := range []string{"table", "wal"} {
		rss, err := logBigTxn(ctx, c, pool, mode)
		if err != nil {
			return nil, fmt.Errorf("%d-event transaction, %s mode: %w", c.bigTxn, mode, err)
		}
		s := series{Name: fmt.Sprintf("%s: peak RSS relaying one %d-event transaction, MiB", mode, c.bigTxn), Unit: ""}
		s.add(rss)
		out = append(out, s)
	}
	fmt.Print(tableOf("log relay", out))
	return out, nil
}

func tableOf(title string, rows []series) string { return table(title, rows) }

func runtimeGC() { runtime.GC(); debug.FreeOSMemory() }

type logFigures struct {
	mode                string
	rate                float64
	writerWAL, relayWAL float64 // bytes per event
	relayXacts          float64 // database transactions the relay ran per event (pg_stat_database)
	relayStmts          float64 // statements the relay sent per event, after its start-up (counted by pgx)
	idleStmts           float64 // statements the relay sent a second while idle
	idleCores           float64
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&n)
	return n, err
}

func xacts(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	// The stats are flushed by each backend every second at most: wait for them to settle.
	time.Sleep(1100 * time.Millisecond)
	_, _ = pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	err := pool.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	return n, err
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// logDrain preloads c.events events and times a relay draining them: "poll", the polling relay;
// "table" and "wal", the log relay, whose slot is made before the preload so that it reads the
// events from the log.
func logDrain(ctx context.Context, c config, pool *pgxpool.Pool, rep int, mode string) (logFigures, error) {
	f := logFigures{mode: mode}
	schema, drop, err := newSchema(ctx, pool, fmt.Sprintf("bench_log_%s_%d", mode, rep))
	if err != nil {
		return f, err
	}
	defer drop()
	// The relay's own pool, its statements counted.
	relayPool, stmts, err := countingPool(ctx, pool)
	if err != nil {
		return f, err
	}
	defer relayPool.Close()
	topic := "bench.log." + schema
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
	if err != nil {
		return f, err
	}
	defer pub.Close()
	fwd, err := drainRelay(c, storeIn(relayPool, schema, pgxstore.Config{}), pub, "bench")
	if err != nil {
		return f, err
	}
	var relay *pglog.Relay
	if mode != "poll" {
		var dropSlot func()
		relay, dropSlot, err = newLogRelay(relayPool, fwd, mode)
		if err != nil {
			return f, err
		}
		defer dropSlot()
		// Make the slot, then stop: the preload waits in the log.
		if err := runFor(ctx, relay, 0); err != nil {
			return f, err
		}
	}
	w0, err := walLSN(ctx, pool)
	if err != nil {
		return f, err
	}
	if err := preloadOutboxkit(ctx, pool, schema, topic, c, pgxstore.Config{DisableNotify: true, WAL: mode == "wal", PollOnly: true}); err != nil {
		return f, err
	}
	w1, err := walLSN(ctx, pool)
	if err != nil {
		return f, err
	}
	f.writerWAL = float64(w1-w0) / float64(c.events)
	cnt, err := newCounter(c.brokerURL, topic, c.events)
	if err != nil {
		return f, err
	}
	defer cnt.close()
	x0, err := xacts(ctx, pool)
	if err != nil {
		return f, err
	}
	run, reading := fwd.Run, fwd.Running()
	if relay != nil {
		run, reading = relay.Run, relay.Reading()
	}
	var s0 int64
	f.rate, err = timedDrain{
		events: c.events,
		run:    []func(context.Context) error{run},
		arrived: func() error {
			if err := started(reading, mode+" relay"); err != nil {
				return err
			}
			s0 = stmts.n.Load() // its start-up's statements are behind
			return cnt.wait(ctx, 5*time.Minute)
		},
		// The backlog is published: what does the relay cost while nothing is written?
		atRest: func() error {
			time.Sleep(2 * time.Second) // its last flush and confirmation
			s1 := stmts.n.Load()
			f.relayStmts = float64(s1-s0) / float64(c.events)
			cpu0, t0 := cpuSeconds(), time.Now()
			time.Sleep(c.logIdle)
			f.idleCores = (cpuSeconds() - cpu0) / time.Since(t0).Seconds()
			f.idleStmts = float64(stmts.n.Load()-s1) / time.Since(t0).Seconds()
			return nil
		},
	}.rate(ctx)
	if err != nil {
		return f, err
	}
	x1, err := xacts(ctx, pool)
	if err != nil {
		return f, err
	}
	w2, err := walLSN(ctx, pool)
	if err != nil {
		return f, err
	}
	// The two xacts() reads are this pool's own: two transactions not the relay's.
	f.relayXacts = float64(x1-x0-2) / float64(c.events)
	f.relayWAL = float64(w2-w1) / float64(c.events)
	return f, nil
}

// newLogRelay is the log relay of fwd in mode ("table" or "wal") on pool, with the function that
// drops its slot and publication: call it once the relay has stopped (the server refuses to drop
// a slot that is read; it waits up to 5 s for the walsender to let go).
func newLogRelay(pool *pgxpool.Pool, fwd *forwarder.Forwarder, mode string) (*pglog.Relay, func(), error) {
	pm := pglog.ModeTable
	if mode == "wal" {
		pm = pglog.ModeWAL
	}
	relay, err := pglog.New(pglog.Config{Forwarder: fwd, Pool: pool, Mode: pm})
	if err != nil {
		return nil, nil, err
	}
	return relay, func() {
		for range 50 {
			if _, err := pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", relay.SlotName()); err == nil ||
				!strings.Contains(err.Error(), "active") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+relay.SlotName())
	}, nil
}

// runFor runs relay until it reads its slot, then d more, then stops it.
func runFor(ctx context.Context, relay *pglog.Relay, d time.Duration) error {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	select {
	case <-relay.Reading():
	case err := <-done:
		cancel()
		return fmt.Errorf("the log relay stopped before reading: %w", err)
	case <-time.After(30 * time.Second):
		cancel()
		return errors.Join(errors.New("the log relay did not read its slot within 30s"), <-done)
	}
	time.Sleep(d)
	cancel()
	return <-done
}

// discardCounter discards what it is given and counts it: the relay's own memory, without a
// broker client's buffers.
type discardCounter struct{ n atomic.Int64 }

func (p *discardCounter) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}
func (p *discardCounter) Close() error { return nil }

// logBigTxn writes one transaction of c.bigTxn events on the server side (no client memory), then
// relays it and returns the process's peak RSS in MiB over the relaying, the peak reset before.
func logBigTxn(ctx context.Context, c config, pool *pgxpool.Pool, mode string) (float64, error) {
	schema, drop, err := newSchema(ctx, pool, "bench_log_big_"+mode)
	if err != nil {
		return 0, err
	}
	defer drop()
	pub := &discardCounter{}
	fwd, err := forwarder.New(forwarder.Config{Store: storeIn(pool, schema, pgxstore.Config{}), Publisher: pub, Name: "bench",
		BatchSize: c.batch, MaxInFlight: c.inFlight})
	if err != nil {
		return 0, err
	}
	relay, dropSlot, err := newLogRelay(pool, fwd, mode)
	if err != nil {
		return 0, err
	}
	defer dropSlot()
	if err := runFor(ctx, relay, 0); err != nil {
		return 0, err
	}
	body := `'{"order_id":"order-0001","n":1,"customer":"customer-1","total_cents":7}'`
	if mode == "table" {
		_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.outbox (uuid, topic, partition_key, payload, metadata)
			SELECT gen_random_uuid(), 'orders', 'order-' || (g %% %d), convert_to(%s, 'UTF8'), '{}' FROM generate_series(1, %d) g`,
			schema, c.keys, body, c.bigTxn))
	} else {
		// walmsg's layout, built in SQL: version 1, then uuid (36), topic (6), key and metadata
		// with their one-byte lengths, then the payload.
		_, err = pool.Exec(ctx, fmt.Sprintf(`SELECT count(pg_logical_emit_message(true, $1,
			'\x01'::bytea || '\x24'::bytea || convert_to(gen_random_uuid()::text, 'UTF8') || '\x06'::bytea || convert_to('orders', 'UTF8')
			|| set_byte('\x00'::bytea, 0, length('order-' || (g %% %d))) || convert_to('order-' || (g %% %d), 'UTF8')
			|| '\x02'::bytea || convert_to('{}', 'UTF8') || convert_to(%s, 'UTF8'))) FROM generate_series(1, %d) g`,
			c.keys, c.keys, body, c.bigTxn), walmsg.Prefix(schema))
	}
	if err != nil {
		return 0, err
	}
	runtimeGC()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset the peak RSS: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	deadline := time.Now().Add(5 * time.Minute)
	for pub.n.Load() < int64(c.bigTxn) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	peak := peakRSS()
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	if got := pub.n.Load(); got < int64(c.bigTxn) {
		return 0, fmt.Errorf("only %d of %d events relayed within 5 minutes", got, c.bigTxn)
	}
	fmt.Printf("  one %d-event transaction, %s mode: relayed, peak RSS %.1f MiB\n", c.bigTxn, mode, peak)
	return peak, nil
}

// peakRSS is the process's VmHWM in MiB.
func peakRSS() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:")), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// stmtCounter is a pgx tracer counting the statements its connections send, each query of a
// batch and each COPY included: the relay's own work, apart from the writers' and the bench's.
type stmtCounter struct {
	n     atomic.Int64
	flush flushTimer // times the log relay's checkpoints when it has a clock
}

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return s.flush.start(ctx, d.SQL)
}
func (s *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s.flush.end(ctx)
}
func (s *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.n.Add(1)
}
func (s *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (s *stmtCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	s.n.Add(1)
	return ctx
}
func (s *stmtCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// countingPool is a pool of its own on pool's database whose statements are counted: give it to
// a relay to count what the relay alone runs.
func countingPool(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, *stmtCounter, error) {
	cfg := pool.Config()
	cnt := &stmtCounter{}
	cfg.ConnConfig.Tracer = cnt
	cfg.MaxConns = 16 // as many as a polling relay's lanes use at once
	cfg.MinConns = 0
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	return p, cnt, err
}
