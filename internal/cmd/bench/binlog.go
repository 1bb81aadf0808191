package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// benchBinlog measures the binlog relay (forwarder/mysqlbinlog) beside the polling relay on the
// same MySQL or MariaDB server, one with the binary log on (--binlog-db, scripts/mariadb-binlog.sh),
// in the parts --binlog-parts names: "drain" (binlogDrains) and "latency" (binlogLatency).
func benchBinlog(ctx context.Context, c config) ([]series, error) {
	parts := map[string]func(context.Context, config, *binlogServer) ([]series, error){
		"drain": binlogDrains, "latency": binlogLatency,
	}
	var runs []func(context.Context, config, *binlogServer) ([]series, error)
	for _, part := range strings.Split(c.binlogParts, ",") {
		run, ok := parts[strings.TrimSpace(part)]
		if !ok {
			return nil, fmt.Errorf("--binlog-parts: no part %q; the parts are drain and latency", part)
		}
		runs = append(runs, run)
	}
	s, err := openBinlogServer(ctx, c.binlogDBURL)
	if err != nil {
		return nil, err
	}
	defer s.close()
	fmt.Printf("\nbinlog: on %s\n", s.header)
	if s.pid == 0 {
		fmt.Println("  the server's threads are not readable from here (not on this machine, or no PROCESSLIST.TID): no server CPU figures")
	}
	var out []series
	for _, run := range runs {
		r, err := run(ctx, c, s)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}

// The ways the events reach a relay in binlogDrain.
const (
	// pathPreload: written before the relay starts; the binlog relay's first start reads them
	// from the table (its backfill), the polling relay claims them.
	pathPreload = "preload"
	// pathCatchUp: the binlog relay started once and stopped, then the events written: it
	// reads them from the binary log when it starts again.
	pathCatchUp = "catch-up"
	// pathStream: the relay started and reading, then the events written by the streaming
	// writers while it relays them.
	pathStream = "stream"
)

// binlogFigures are one relay's figures over one drain.
type binlogFigures struct {
	rate      float64
	lag       time.Duration // streaming: from the writers' last COMMIT returned to the last event at the broker
	stmts     stmtRates     // the relay's statements per event
	serverCPU float64       // the server process's CPU per event, µs; 0 where it cannot be read
	// After a streaming drain, idle: the relay's statements a second, its process's CPU and its
	// sessions' CPU on the server, in cores.
	idleStmts, idleCores, idleServerCores float64
	idleSessions                          int
}

// binlogDrains drains the same number of events, in each round, with the raw broker, the
// streaming writers alone (their rate, and their statements, taken out of the streaming drains'),
// the polling relay and the binlog relay — preloaded, from the binary log after a restart (the
// binlog relay only) and streaming — and after each streaming drain measures the relay idle.
func binlogDrains(ctx context.Context, c config, s *binlogServer) ([]series, error) {
	fmt.Printf("\nbinlog, drain: %d events over %d keys → RabbitMQ with publisher confirms, %d reps; streaming writers: %d, %d events a transaction, "+
		"a key's events all from one writer; idle %s after each streaming drain\n",
		c.events, c.keys, c.reps, c.binlogWriters, c.binlogTxn, c.logIdle)
	type run struct{ mode, path, name string }
	runs := []run{
		{"poll", pathPreload, "polling relay, preloaded"},
		{"binlog", pathPreload, "binlog relay, preloaded, first start: reads the table (backfill)"},
		{"binlog", pathCatchUp, "binlog relay, preloaded, restarted: reads the binary log (catch-up)"},
		{"poll", pathStream, "polling relay, streaming: running, then the events written"},
		{"binlog", pathStream, "binlog relay, streaming: reading, then the events written"},
	}
	raw := series{Name: "raw amqp091, pipelined confirms", Unit: "msg/s"}
	alone := series{Name: fmt.Sprintf("streaming writers alone (%d, %d events a transaction), no relay", c.binlogWriters, c.binlogTxn), Unit: "msg/s"}
	rates := make([]series, len(runs))
	stmts := make([]series, len(runs))
	cpu := make([]series, len(runs))
	for i, r := range runs {
		rates[i] = series{Name: r.name, Unit: "msg/s"}
		which := "start-up included"
		if r.path == pathStream {
			which = "after start-up, the writers' taken out"
		}
		stmts[i] = series{Name: fmt.Sprintf("%s %s: relay statements/event, %s", r.mode, r.path, which), Unit: ""}
		cpu[i] = series{Name: fmt.Sprintf("%s %s: server CPU, µs/event", r.mode, r.path), Unit: ""}
		if r.path == pathStream {
			cpu[i].Name += ", the writers' included"
		}
	}
	idle := map[string]*[4]series{}
	for _, mode := range []string{"poll", "binlog"} {
		idle[mode] = &[4]series{
			{Name: mode + ": relay statements/s while idle", Unit: ""},
			{Name: mode + ": relay process CPU while idle, cores", Unit: ""},
			{Name: mode + ": the relay's server sessions' CPU while idle, cores", Unit: ""},
			{Name: mode + ": the relay's server sessions while idle", Unit: ""},
		}
	}
	writerCPU := series{Name: "streaming writers alone: server CPU, µs/event", Unit: ""}
	lag := map[string]*series{
		"poll":   {Name: "polling relay, streaming: the writers' last COMMIT returned → the last event at the broker", Unit: "ms"},
		"binlog": {Name: "binlog relay, streaming: the writers' last COMMIT returned → the last event at the broker", Unit: "ms"},
	}
	for rep := 1; rep <= c.reps; rep++ {
		r, err := drainRaw(ctx, c, rep)
		if err != nil {
			return nil, fmt.Errorf("raw drain: %w", err)
		}
		raw.add(r)
		wr, wcost, wcpu, err := binlogWritersAlone(ctx, c, s, rep)
		if err != nil {
			return nil, fmt.Errorf("streaming writers alone: %w", err)
		}
		alone.add(wr)
		if s.pid != 0 {
			writerCPU.add(wcpu)
		}
		fmt.Printf("  round %d: raw %.0f msg/s; streaming writers alone %.0f msg/s, %.4f statements/event (%s)\n",
			rep, r, wr, wcost.total(), wcost.kinds())
		for i, run := range runs {
			f, err := binlogDrain(ctx, c, s, rep, run.mode, run.path, wcost)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", run.name, err)
			}
			rates[i].add(f.rate)
			stmts[i].add(f.stmts.total())
			if s.pid != 0 {
				cpu[i].add(f.serverCPU)
			}
			fmt.Printf("    %-7s %-8s %7.0f msg/s (%.2f× raw), relay statements %.4f/event (%s), server CPU %.1f µs/event\n",
				run.mode, run.path, f.rate, f.rate/r, f.stmts.total(), f.stmts.kinds(), f.serverCPU)
			if run.path == pathStream {
				lag[run.mode].add(ms(f.lag))
				fmt.Printf("    %-7s %-8s the last event at the broker %.1f ms after the writers' last COMMIT returned\n", run.mode, "", ms(f.lag))
				fmt.Printf("    %-7s idle:    %.2f statements/s, process CPU %.4f cores, its %d server sessions %.4f cores\n",
					run.mode, f.idleStmts, f.idleCores, f.idleSessions, f.idleServerCores)
				d := idle[run.mode]
				d[0].add(f.idleStmts)
				d[1].add(f.idleCores)
				if s.pid != 0 {
					d[2].add(f.idleServerCores)
					d[3].add(float64(f.idleSessions))
				}
			}
		}
	}
	out := append(append([]series{raw, alone}, rates...), *lag["poll"], *lag["binlog"])
	var ratios []series
	for i, r := range runs {
		ratios = append(ratios, ratio(fmt.Sprintf("%s %s / raw broker", r.mode, r.path), rates[i], raw))
	}
	ratios = append(ratios,
		ratio("binlog stream / polling stream", rates[4], rates[3]),
		ratio("binlog preload (backfill) / polling preload", rates[1], rates[0]),
		ratio("binlog stream / writers alone", rates[4], alone))
	cost := append(append([]series{}, stmts...), cpu...)
	cost = append(cost, writerCPU)
	for _, mode := range []string{"poll", "binlog"} {
		cost = append(cost, idle[mode][:]...)
	}
	fmt.Print(table("binlog relay, drain rate", out))
	fmt.Print(table("binlog relay, drain rate paired by round", ratios))
	fmt.Print(table("binlog relay, what the relay costs the server", cost))
	return append(append(out, ratios...), cost...), nil
}

// binlogWritersAlone writes c.events events with the streaming writers into an outbox no relay
// reads: their rate, the statements they send per event (the streaming drains take them out of
// theirs) and the server's CPU per event meanwhile, µs.
func binlogWritersAlone(ctx context.Context, c config, s *binlogServer, rep int) (float64, stmtRates, float64, error) {
	o, drop, err := s.newOutbox(ctx, fmt.Sprintf("bench_binlog_writers_%d", rep), max(1, c.binlogWriters))
	if err != nil {
		return 0, nil, 0, err
	}
	defer drop()
	c0, err := s.counters(ctx)
	if err != nil {
		return 0, nil, 0, err
	}
	cpu0 := s.serverCPU()
	took, err := writeStreams(ctx, c, o, "bench.binlog."+o.name)
	if err != nil {
		return 0, nil, 0, err
	}
	cpu := s.serverCPU() - cpu0
	c1, err := s.counters(ctx)
	if err != nil {
		return 0, nil, 0, err
	}
	return rate(c.events, took), statements(c0, c1, s.oneRead, c.events), float64(cpu.Microseconds()) / float64(c.events), nil
}

// binlogRelay is a relay of an outbox: the polling relay (forwarder.Run) or the binlog relay,
// each on a store of its own pool.
type binlogRelay struct {
	run   func(context.Context) error
	ready func() <-chan struct{} // Running, or Reading
	db    *store.DB
}

// newRelay builds the relay of o in mode ("poll" or "binlog"), publishing to pub, as the log
// scenario's drains build theirs (drainRelay: --batch, --inflight, published rows kept by the
// polling relay; the binlog relay removes them at its checkpoints whatever the retention).
func (s *binlogServer) newRelay(ctx context.Context, c config, o *binlogOutbox, mode string, pub message.Publisher) (*binlogRelay, error) {
	db, err := s.open(ctx, o.name, 0)
	if err != nil {
		return nil, err
	}
	fwd, err := drainRelay(c, db, pub, "bench")
	if err != nil {
		db.Close()
		return nil, err
	}
	if mode == "poll" {
		return &binlogRelay{run: fwd.Run, ready: fwd.Running, db: db}, nil
	}
	relay, err := mysqlbinlog.New(mysqlbinlog.Config{Forwarder: fwd, URL: s.url})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &binlogRelay{run: relay.Run, ready: relay.Reading, db: db}, nil
}

// startStop runs r until it is ready, then for d more (the binlog relay: past its first
// checkpoint after the table's reading), then stops it.
func (r *binlogRelay) startStop(ctx context.Context, d time.Duration) error {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.run(rctx) }()
	select {
	case <-r.ready():
	case err := <-done:
		cancel()
		return fmt.Errorf("the relay stopped before it was ready: %w", err)
	case <-time.After(30 * time.Second):
		cancel()
		return errors.Join(errors.New("the relay was not ready within 30s"), <-done)
	}
	time.Sleep(d)
	cancel()
	return <-done
}

// binlogDrain times one relay (mode "poll" or "binlog") over c.events events reaching it by path
// (pathPreload, pathCatchUp or pathStream), and counts what it ran on the server meanwhile:
// from the relay's start with a preload (its start-up and the binlog relay's reading of the table
// included), from the relay ready on when streaming, less writers (the streaming writers'
// statements per event), until 2 s after the last event arrived (the relay's last checkpoint).
// After a streaming drain it measures the relay idle for --log-idle.
func binlogDrain(ctx context.Context, c config, s *binlogServer, rep int, mode, path string, writers stmtRates) (binlogFigures, error) {
	var f binlogFigures
	o, drop, err := s.newOutbox(ctx, fmt.Sprintf("bench_binlog_%s_%s_%d", mode, strings.ReplaceAll(path, "-", ""), rep), max(1, c.binlogWriters))
	if err != nil {
		return f, err
	}
	defer drop()
	topic := "bench.binlog." + o.name
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
	if err != nil {
		return f, err
	}
	defer pub.Close()
	relay, err := s.newRelay(ctx, c, o, mode, pub)
	if err != nil {
		return f, err
	}
	defer relay.db.Close()
	if path == pathCatchUp {
		// Its first start (an empty table), past its first checkpoint, and a clean stop: the
		// group reads on from there.
		if err := relay.startStop(ctx, mysqlbinlog.DefaultFlushInterval+500*time.Millisecond); err != nil {
			return f, fmt.Errorf("first start: %w", err)
		}
	}
	if path != pathStream {
		if err := preloadEvents(c, func(msgs []*message.Message) error { return o.write(ctx, topic, msgs, false) }); err != nil {
			return f, err
		}
	}
	cnt, err := newCounter(c.brokerURL, topic, c.events)
	if err != nil {
		return f, err
	}
	defer cnt.close()
	c0, err := s.counters(ctx)
	if err != nil {
		return f, err
	}
	cpu0 := s.serverCPU()
	less := []stmtRates{}
	r, err := timedDrain{
		events: c.events,
		run:    []func(context.Context) error{relay.run},
		arrived: func() error {
			if path != pathStream {
				return cnt.wait(ctx, 5*time.Minute)
			}
			if err := started(relay.ready(), mode+" relay"); err != nil {
				return err
			}
			// Its start-up's statements are behind: the window starts here.
			var readErr error
			if c0, readErr = s.counters(ctx); readErr != nil {
				return readErr
			}
			cpu0 = s.serverCPU()
			less = append(less, writers)
			start := time.Now()
			wrote := make(chan error, 1)
			var writersDone time.Time
			go func() {
				took, err := writeStreams(ctx, c, o, topic)
				writersDone = start.Add(took)
				wrote <- err
			}()
			if err := cnt.wait(ctx, 5*time.Minute); err != nil {
				return errors.Join(err, <-wrote)
			}
			end := time.Now()
			writeErr := <-wrote
			f.rate, f.lag = rate(c.events, end.Sub(start)), max(0, end.Sub(writersDone))
			return writeErr
		},
		atRest: func() error {
			time.Sleep(2 * time.Second) // its last checkpoint, and any event published twice
			cpu := s.serverCPU() - cpu0
			c1, err := s.counters(ctx)
			if err != nil {
				return err
			}
			if got := cnt.got.Load(); got != int64(c.events) {
				return fmt.Errorf("%d events reached the broker for %d written: some twice, which a clean drain does not do", got, c.events)
			}
			f.stmts = statements(c0, c1, s.oneRead, c.events, less...)
			f.serverCPU = float64(cpu.Microseconds()) / float64(c.events)
			if path == pathStream {
				return binlogIdle(ctx, c, s, o, &f)
			}
			return nil
		},
	}.rate(ctx)
	if path != pathStream {
		f.rate = r // from the relay's start, as the log scenario's drains
	}
	return f, err
}

// binlogIdle measures the relay running without traffic for --log-idle, the writers' pool closed:
// its statements a second, its process's CPU and its server sessions' CPU, in cores.
func binlogIdle(ctx context.Context, c config, s *binlogServer, o *binlogOutbox, f *binlogFigures) error {
	_ = o.writers.Close()
	var sess0 time.Duration
	if s.pid != 0 {
		var err error
		if sess0, _, err = s.sessionsCPU(ctx); err != nil {
			return err
		}
	}
	i0, err := s.counters(ctx)
	if err != nil {
		return err
	}
	cpu0, t0 := cpuSeconds(), time.Now()
	time.Sleep(c.logIdle)
	i1, err := s.counters(ctx)
	if err != nil {
		return err
	}
	took := time.Since(t0).Seconds()
	f.idleCores = (cpuSeconds() - cpu0) / took
	f.idleStmts = statements(i0, i1, s.oneRead, 1).total() / took
	if s.pid != 0 {
		sess1, n, err := s.sessionsCPU(ctx)
		if err != nil {
			return err
		}
		f.idleServerCores, f.idleSessions = (sess1-sess0).Seconds()/took, n
	}
	return nil
}

// write commits msgs to topic in one transaction of o's writers, after an order row when order
// is set (the business change of binlogLatency's writers).
func (o *binlogOutbox) write(ctx context.Context, topic string, msgs []*message.Message, order bool) error {
	tx, err := o.writers.SQL.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if order {
		if _, err := tx.ExecContext(ctx, "INSERT INTO `"+o.name+"`.orders (customer) VALUES (?)", "customer"); err != nil {
			return err
		}
	}
	pub, err := pipeline.NewPublisher(o.writers, tx, pipeline.PublisherConfig{})
	if err != nil {
		return err
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return err
	}
	return tx.Commit()
}

// writeStreams writes c.events events over c.keys keys into o from --binlog-writers writers at
// once, in transactions of --binlog-txn events; a key's events all come from one writer (key k
// from writer k mod writers), in order, so that every relay sees each key's events in commit
// order and in seq order alike. It returns how long the writing took.
func writeStreams(ctx context.Context, c config, o *binlogOutbox, topic string) (time.Duration, error) {
	writers, per := max(1, c.binlogWriters), max(1, c.binlogTxn)
	var wg sync.WaitGroup
	errs := make([]error, writers)
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var msgs []*message.Message
			for i := range c.events {
				if (i%c.keys)%writers != w {
					continue
				}
				body, key := payload(i, c.keys)
				msgs = append(msgs, pipeline.NewEvent("OrderPlaced", key, body))
				if len(msgs) == per {
					if errs[w] = o.write(ctx, topic, msgs, false); errs[w] != nil {
						return
					}
					msgs = nil
				}
			}
			if len(msgs) > 0 {
				errs[w] = o.write(ctx, topic, msgs, false)
			}
		}()
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}
