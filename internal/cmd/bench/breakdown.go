package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stageClock timestamps each event of an end-to-end run at every hand-over between COMMIT
// returned and the consumer's acknowledgement, for --log-parts breakdown. A run without one
// (every other scenario) wraps nothing and pays nothing.
type stageClock struct {
	mu      sync.Mutex
	ev      map[string]*stamps
	batches []*batchTimes
	cur     *batchTimes     // the consumer's transaction in progress: it runs one at a time
	rounds  []roundTimes    // the relay's publish rounds, when relayHook reports them
	flushes []time.Duration // the relay's checkpoint statements
}

type stamps struct {
	relayRecv time.Time // the relay's reader decoded it (relayHook only)
	pubStart  time.Time // the relay called Publish
	pubDone   time.Time // Publish returned: the broker confirmed
	subRecv   time.Time // the consumer's subscriber handed it out
	handled   time.Time // the handler ran, inside the batch's transaction
	batch     *batchTimes
}

type batchTimes struct {
	begin, commitStart, commitEnd time.Time
	n                             int // messages
	stmts                         int // statements, BEGIN and COMMIT included
}

type roundTimes struct {
	n    int
	took time.Duration
}

// relayHook, when a build sets it, has the log relay report when its reader decoded each event and
// how long each publish round took. Set by a local, unlanded patch of forwarder/pglog (see
// results/2026-12-02-latency-breakdown.txt); nil otherwise, and stage (a) and (b) are then reported
// together.
var relayHook func(*stageClock) (unhook func())

func newStageClock() *stageClock { return &stageClock{ev: map[string]*stamps{}} }

func (c *stageClock) at(uuid string) *stamps {
	s := c.ev[uuid]
	if s == nil {
		s = &stamps{}
		c.ev[uuid] = s
	}
	return s
}

// clockedPublisher times each Publish call: the relay's publish of one row, which returns once the
// broker confirmed it.
type clockedPublisher struct {
	message.Publisher
	c *stageClock
}

func (p clockedPublisher) Publish(topic string, msgs ...*message.Message) error {
	start := time.Now()
	err := p.Publisher.Publish(topic, msgs...)
	done := time.Now()
	p.c.mu.Lock()
	for _, m := range msgs {
		s := p.c.at(m.UUID)
		if s.pubStart.IsZero() {
			s.pubStart = start
		}
		if err == nil {
			s.pubDone = done
		}
	}
	p.c.mu.Unlock()
	return err
}

// Check keeps the forwarder watching the broker as it watches the publisher's.
func (p clockedPublisher) Check(ctx context.Context) error {
	if c, ok := p.Publisher.(interface{ Check(context.Context) error }); ok {
		return c.Check(ctx)
	}
	return nil
}

func (c *stageClock) subReceived(uuid string) {
	now := time.Now()
	c.mu.Lock()
	if s := c.at(uuid); s.subRecv.IsZero() {
		s.subRecv = now
	}
	c.mu.Unlock()
}

// handler wraps the consumer's handler: the message's place in the batch's transaction.
func (c *stageClock) handler(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		now := time.Now()
		c.mu.Lock()
		s := c.at(msg.UUID)
		if s.handled.IsZero() {
			s.handled, s.batch = now, c.cur
			if c.cur != nil {
				c.cur.n++
			}
		}
		c.mu.Unlock()
		return h(msg)
	}
}

// The consumer's pool tracer: BEGIN opens a transaction, COMMIT's start and end close it.
func (c *stageClock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	sql := strings.ToLower(strings.TrimSpace(d.SQL))
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.commitEnd.IsZero() {
		c.cur.stmts++
	}
	switch {
	case strings.HasPrefix(sql, "begin"):
		c.cur = &batchTimes{begin: now, stmts: 1}
		c.batches = append(c.batches, c.cur)
	case sql == "commit" && c.cur != nil:
		c.cur.commitStart = now
		return context.WithValue(ctx, commitKey{}, c.cur)
	}
	return ctx
}

type commitKey struct{}

// A batch whose first statement is BEGIN opens a transaction too (pgxstore sends a batch
// consumer's BEGIN with its inbox INSERT); any other batch is one more statement of the open one.
func (c *stageClock) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch == nil || len(d.Batch.QueuedQueries) == 0 {
		return ctx
	}
	sql := strings.ToLower(strings.TrimSpace(d.Batch.QueuedQueries[0].SQL))
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.HasPrefix(sql, "begin"):
		c.cur = &batchTimes{begin: now, stmts: 1}
		c.batches = append(c.batches, c.cur)
	case c.cur != nil && c.cur.commitEnd.IsZero():
		c.cur.stmts++
	}
	return ctx
}

func (c *stageClock) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *stageClock) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *stageClock) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if b, ok := ctx.Value(commitKey{}).(*batchTimes); ok {
		now := time.Now()
		c.mu.Lock()
		b.commitEnd = now
		c.mu.Unlock()
	}
}

// flushTimer times the relay's checkpoint statement (the outbox's published rows removed, the
// confirmed position recorded), which runs in the dispatcher's loop between two rounds.
type flushTimer struct{ c *stageClock }

type flushKey struct{}

func (f flushTimer) start(ctx context.Context, sql string) context.Context {
	if f.c == nil || !strings.Contains(sql, "log_relays") {
		return ctx
	}
	return context.WithValue(ctx, flushKey{}, time.Now())
}

func (f flushTimer) end(ctx context.Context) {
	if t, ok := ctx.Value(flushKey{}).(time.Time); ok {
		d := time.Since(t)
		f.c.mu.Lock()
		f.c.flushes = append(f.c.flushes, d)
		f.c.mu.Unlock()
	}
}

// clockedPool is a pool of its own on pool's database for the consumer, its transactions timed.
func clockedPool(ctx context.Context, pool *pgxpool.Pool, c *stageClock) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = c
	cfg.MaxConns, cfg.MinConns = 8, 0
	return pgxpool.NewWithConfig(ctx, cfg)
}

// stage is one hand-over's durations, per event.
type stage struct {
	name string
	d    []time.Duration
}

func (s stage) line() string {
	if len(s.d) == 0 {
		return fmt.Sprintf("  %-62s %s\n", s.name, "—")
	}
	var sum time.Duration
	for _, d := range s.d {
		sum += d
	}
	return fmt.Sprintf("  %-62s %8.2f %8.2f %8.2f %8.2f %7d\n", s.name, ms(sum/time.Duration(len(s.d))),
		ms(percentile(s.d, 50)), ms(percentile(s.d, 90)), ms(percentile(s.d, 99)), len(s.d))
}

// report prints the stages of the timed events (committed: COMMIT returned, acked: the
// acknowledgement seen), and the relay's rounds and the consumer's batches.
func (c *stageClock) report(committed, acked, delivered *sync.Map) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		a, b, ab, cc, probe, d, dFromPub, e, inTx, f, commit, g, total, sum stage
	)
	a.name = "(a) COMMIT returned → relay's reader decoded it"
	b.name = "(b) decoded → relay calls Publish (waits for its round)"
	ab.name = "(a+b) COMMIT returned → relay calls Publish"
	cc.name = "(c) Publish → broker confirmed (Publish returned)"
	probe.name = "    Publish → raw probe consumer received it"
	d.name = "(d) confirmed → consumer's subscriber handed it out"
	dFromPub.name = "    Publish → consumer's subscriber handed it out"
	e.name = "(e) handed out → its batch's BEGIN (channel, collect, batch before)"
	inTx.name = "    BEGIN → its handler ran (inbox insert, earlier handlers)"
	f.name = "(f) its batch's transaction, BEGIN → COMMIT returned"
	commit.name = "    COMMIT alone"
	g.name = "(g) COMMIT returned → acknowledgement seen"
	total.name = "total: COMMIT returned → acknowledgement seen"
	sum.name = "check: (a+b)+(c)+(d)+(e)+(f)+(g)"
	committed.Range(func(k, v any) bool {
		uuid, t0 := k.(string), v.(time.Time)
		s := c.ev[uuid]
		tAck, ok := acked.Load(uuid)
		if s == nil || !ok || s.pubStart.IsZero() || s.pubDone.IsZero() || s.subRecv.IsZero() || s.batch == nil || s.batch.commitEnd.IsZero() {
			return true
		}
		t1 := tAck.(time.Time)
		bt := s.batch
		if !s.relayRecv.IsZero() {
			a.d = append(a.d, s.relayRecv.Sub(t0))
			b.d = append(b.d, s.pubStart.Sub(s.relayRecv))
		}
		ab.d = append(ab.d, s.pubStart.Sub(t0))
		cc.d = append(cc.d, s.pubDone.Sub(s.pubStart))
		if tp, ok := delivered.Load(uuid); ok {
			probe.d = append(probe.d, tp.(time.Time).Sub(s.pubStart))
		}
		d.d = append(d.d, s.subRecv.Sub(s.pubDone))
		dFromPub.d = append(dFromPub.d, s.subRecv.Sub(s.pubStart))
		e.d = append(e.d, bt.begin.Sub(s.subRecv))
		inTx.d = append(inTx.d, s.handled.Sub(bt.begin))
		f.d = append(f.d, bt.commitEnd.Sub(bt.begin))
		commit.d = append(commit.d, bt.commitEnd.Sub(bt.commitStart))
		g.d = append(g.d, t1.Sub(bt.commitEnd))
		total.d = append(total.d, t1.Sub(t0))
		sum.d = append(sum.d, s.pubStart.Sub(t0)+s.pubDone.Sub(s.pubStart)+s.subRecv.Sub(s.pubDone)+bt.begin.Sub(s.subRecv)+
			bt.commitEnd.Sub(bt.begin)+t1.Sub(bt.commitEnd))
		return true
	})
	var out strings.Builder
	fmt.Fprintf(&out, "  %-62s %8s %8s %8s %8s %7s\n", "stage, per event (ms)", "mean", "p50", "p90", "p99", "events")
	for _, s := range []stage{a, b, ab, cc, probe, d, dFromPub, e, inTx, f, commit, g, total, sum} {
		out.WriteString(s.line())
	}
	var sizes []time.Duration // batch sizes, as counts
	var txs, commits, stmts []time.Duration
	for _, bt := range c.batches {
		if bt.n == 0 || bt.commitEnd.IsZero() {
			continue
		}
		sizes = append(sizes, time.Duration(bt.n))
		stmts = append(stmts, time.Duration(bt.stmts-bt.n))
		txs = append(txs, bt.commitEnd.Sub(bt.begin))
		commits = append(commits, bt.commitEnd.Sub(bt.commitStart))
	}
	fmt.Fprintf(&out, "  consumer: %d batches, size p50 %d p99 %d max %d, statements besides the handlers' p50 %d max %d; transaction p50 %.2f p99 %.2f ms; COMMIT p50 %.2f p99 %.2f ms\n",
		len(sizes), percentile(sizes, 50), percentile(sizes, 99), percentile(sizes, 100), percentile(stmts, 50), percentile(stmts, 100),
		ms(percentile(txs, 50)), ms(percentile(txs, 99)), ms(percentile(commits, 50)), ms(percentile(commits, 99)))
	if len(c.rounds) > 0 {
		var rs, rt []time.Duration
		for _, r := range c.rounds {
			rs = append(rs, time.Duration(r.n))
			rt = append(rt, r.took)
		}
		fmt.Fprintf(&out, "  relay: %d publish rounds, rows p50 %d p99 %d max %d; round p50 %.2f p90 %.2f p99 %.2f max %.2f ms\n",
			len(rs), percentile(rs, 50), percentile(rs, 99), percentile(rs, 100),
			ms(percentile(rt, 50)), ms(percentile(rt, 90)), ms(percentile(rt, 99)), ms(percentile(rt, 100)))
	}
	if len(c.flushes) > 0 {
		fmt.Fprintf(&out, "  relay: %d checkpoint statements, p50 %.2f p99 %.2f max %.2f ms (beside the dispatcher's loop, which goes on publishing)\n",
			len(c.flushes), ms(percentile(c.flushes, 50)), ms(percentile(c.flushes, 99)), ms(percentile(c.flushes, 100)))
	}
	return out.String()
}

// logBreakdown runs the log relay in WAL mode at 1,000 and 2,000 msg/s with every hand-over
// timed (see stageClock), one run each per rep.
func logBreakdown(ctx context.Context, c config, _ *pgxpool.Pool) ([]series, error) {
	pool, err := e2ePool(ctx, c.logDBURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fmt.Printf("\nlog, where the time goes: COMMIT returned → batch consumer's ack, log relay, RabbitMQ with confirms, 16 writers, %s a run, on %s\n",
		c.e2eFor, c.logDBURL)
	if relayHook == nil {
		fmt.Println("  (this build does not report the relay's reader and rounds: stages (a) and (b) are reported together)")
	}
	var out []series
	for rep := 1; rep <= c.reps; rep++ {
		for _, mode := range strings.Split(c.breakdownModes, ",") {
			for _, rate := range c.breakdownRates {
				impl := e2eImpl{name: "log relay, " + mode + " mode", batched: true, log: mode, probe: true, clock: newStageClock()}
				if relayHook != nil {
					unhook := relayHook(impl.clock)
					defer unhook()
				}
				res, err := e2eOnce(ctx, c, pool, impl, rate, c.e2eFor)
				if err != nil {
					return nil, fmt.Errorf("%s at %d msg/s: %w", impl.name, rate, err)
				}
				fmt.Printf("\n  round %d: %s at %d msg/s (written %.0f/s, missing %d): effect p50 %.1f p99 %.1f ms; %s\n", rep, impl.name, rate,
					res.written, res.missing, ms(percentile(res.latencies, 50)), ms(percentile(res.latencies, 99)), loadAverage())
				fmt.Print(res.breakdown)
				out = append(out, series{Name: fmt.Sprintf("%s at %d msg/s, p99", impl.name, rate), Unit: "ms",
					Values: []float64{ms(percentile(res.latencies, 99))}})
			}
		}
	}
	return out, nil
}

// loadAverage is /proc/loadavg's first three figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:3], ", ")
}
