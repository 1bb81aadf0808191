package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

// idleRelays is one kind of relay process the idle part measures.
type idleRelays struct {
	kind    string // fleetChildSpec.Kind
	tenants int
	rows    idleRows
}

func (r idleRelays) label() string {
	if r.kind == "member" {
		return fmt.Sprintf("fleet member, %d tenants", r.tenants)
	}
	return fmt.Sprintf("%d stock forwarders", r.tenants)
}

// idleRows are the figures of one kind of relay process, a value per round.
type idleRows struct {
	cpu, core, cpuPerTenant             series
	sessions, sessionsMax, listen       series
	xacts, xactsPerTenant, newSessions  series
	rss, heap, rssPerTenant, heapPerTen series
}

func newIdleRows(label string) idleRows {
	s := func(what, unit string) series { return series{Name: "fleet idle, " + label + ": " + what, Unit: unit} }
	return idleRows{
		cpu: s("CPU", "s/min"), core: s("CPU, share of one core", "%"), cpuPerTenant: s("CPU per tenant", "ms/min"),
		sessions: s("Postgres sessions (mean)", "sessions"), sessionsMax: s("Postgres sessions (max)", "sessions"),
		listen: s("LISTEN connections (max)", "sessions"),
		xacts:  s("transactions", "xact/s"), xactsPerTenant: s("transactions per tenant", "xact/s"),
		newSessions: s("sessions opened", "/min"),
		rss:         s("RSS", "MB"), heap: s("Go heap, live", "MB"), rssPerTenant: s("RSS per tenant", "MB"), heapPerTen: s("Go heap per tenant", "KB"),
	}
}

func (r idleRows) all() []series {
	return []series{r.cpu, r.core, r.cpuPerTenant, r.sessions, r.sessionsMax, r.listen, r.xacts, r.xactsPerTenant, r.newSessions,
		r.rss, r.heap, r.rssPerTenant, r.heapPerTen}
}

// idleFigures are one idle window's measurements of a relay process.
type idleFigures struct {
	window                 time.Duration
	cpu                    time.Duration
	sessionsMean           float64
	sessionsMax, listenMax int
	xacts, newSessions     int64
	rssKB                  int64
	heap                   uint64
	tenants                int
	samples                int
}

func (f idleFigures) add(r *idleRows) {
	mins := f.window.Minutes()
	n := float64(f.tenants)
	r.cpu.add(f.cpu.Seconds() / mins)
	r.core.add(100 * f.cpu.Seconds() / f.window.Seconds())
	r.cpuPerTenant.add(1000 * f.cpu.Seconds() / mins / n)
	r.sessions.add(f.sessionsMean)
	r.sessionsMax.add(float64(f.sessionsMax))
	r.listen.add(float64(f.listenMax))
	r.xacts.add(float64(f.xacts) / f.window.Seconds())
	r.xactsPerTenant.add(float64(f.xacts) / f.window.Seconds() / n)
	r.newSessions.add(float64(f.newSessions) / mins)
	r.rss.add(float64(f.rssKB) / 1024)
	r.heap.add(float64(f.heap) / (1 << 20))
	r.rssPerTenant.add(float64(f.rssKB) / 1024 / n)
	r.heapPerTen.add(float64(f.heap) / 1024 / n)
}

func (f idleFigures) String() string {
	return fmt.Sprintf("CPU %.3f s/min (%.2f%% of a core), sessions %.1f (max %d, LISTEN %d), %.1f xact/s, %.0f sessions opened/min, RSS %.1f MB, heap %.1f MB",
		f.cpu.Seconds()/f.window.Minutes(), 100*f.cpu.Seconds()/f.window.Seconds(), f.sessionsMean, f.sessionsMax, f.listenMax,
		float64(f.xacts)/f.window.Seconds(), float64(f.newSessions)/f.window.Minutes(), float64(f.rssKB)/1024, float64(f.heap)/(1<<20))
}

// idleAndJoin measures, round after round, a fleet member relaying --fleet-tenants idle tenants
// (and, with the join part, the tenants added to it one at a time), one relaying --fleet-small,
// and --fleet-baseline-tenants stock forwarders in one process, each a process of its own.
func (b *fleetBench) idleAndJoin(ctx context.Context, parts map[string]bool) ([]series, error) {
	c := b.c
	kinds := []*idleRelays{{kind: "member", tenants: c.fleetTenants}}
	if parts["idle"] {
		kinds = append(kinds, &idleRelays{kind: "member", tenants: c.fleetSmall}, &idleRelays{kind: "forwarders", tenants: c.fleetBaseline})
		fmt.Printf("  idle: each relay process runs alone, its outboxes warmed by an event each, then %s to settle (polls back off), then %s measured\n",
			c.fleetSettle, c.idleFor)
		fmt.Printf("    fleet member: fleet defaults (tick %s, lease %s, relay heartbeat %s, idle poll up to %s), fleetstores.Opener (one handle of up to %d connections, one LISTEN), a TableCatalog\n",
			fleet.DefaultTick, fleet.DefaultLeaseTTL, fleet.DefaultRelayHeartbeat, fleet.DefaultIdlePoll, store.DefaultMaxConns)
		fmt.Printf("    stock forwarders: forwarder defaults (poll %s, heartbeat %s), each on store.Open (MaxConns 1) with its own LISTEN connection: 2 sessions a tenant\n",
			forwarder.DefaultPollInterval, forwarder.DefaultHeartbeatInterval)
		if c.fleetBaseline < c.fleetTenants {
			fmt.Printf("      (%d of them: %d would hold %d sessions, and the server allows %d in all, shared)\n",
				c.fleetBaseline, c.fleetTenants, 2*c.fleetTenants, b.maxConns)
		}
	}
	if parts["join"] {
		fmt.Printf("  join: %d tenants added to the catalog one at a time (a row in a table, committed with the tenant's first event) while the member relays %d;\n"+
			"    timed from that commit to the event at RabbitMQ, each after a random pause of up to a tick\n", c.fleetJoin, c.fleetTenants)
	}
	for _, k := range kinds {
		k.rows = newIdleRows(k.label())
	}
	joinP50 := series{Name: "fleet join: catalog row and first event → broker, p50", Unit: "ms"}
	joinP99 := series{Name: "fleet join: catalog row and first event → broker, p99", Unit: "ms"}
	var joins []time.Duration
	heapSlope := series{Name: fmt.Sprintf("fleet idle: member's Go heap per tenant added, (%d − %d tenants)", c.fleetTenants, c.fleetSmall), Unit: "KB"}
	rssSlope := series{Name: fmt.Sprintf("fleet idle: member's RSS per tenant added, (%d − %d tenants)", c.fleetTenants, c.fleetSmall), Unit: "KB"}
	for rep := 1; rep <= c.reps; rep++ {
		var figs []idleFigures
		for i, k := range kinds {
			f, js, err := b.idleRun(ctx, *k, rep, parts["idle"], parts["join"] && i == 0)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k.label(), err)
			}
			if parts["idle"] {
				f.add(&k.rows)
				figs = append(figs, f)
				fmt.Printf("  round %d, %s: %s\n", rep, k.label(), f)
			}
			if len(js) > 0 {
				joins = append(joins, js...)
				joinP50.add(ms(percentile(js, 50)))
				joinP99.add(ms(percentile(js, 99)))
				fmt.Printf("  round %d, join: %d tenants: p50 %.0f ms, p99 %.0f ms, max %.0f ms\n", rep, len(js),
					ms(percentile(js, 50)), ms(percentile(js, 99)), ms(percentile(js, 100)))
			}
		}
		if parts["idle"] {
			added := float64(c.fleetTenants - c.fleetSmall)
			heapSlope.add((float64(figs[0].heap) - float64(figs[1].heap)) / 1024 / added)
			rssSlope.add(float64(figs[0].rssKB-figs[1].rssKB) / added)
		}
	}
	var out []series
	if parts["idle"] {
		for _, k := range kinds {
			fmt.Print(table("idle: "+k.label(), k.rows.all()))
			out = append(out, k.rows.all()...)
		}
		small, base := kinds[1].rows, kinds[2].rows
		derived := []series{heapSlope, rssSlope}
		if c.fleetSmall == c.fleetBaseline {
			derived = append(derived,
				ratio(fmt.Sprintf("fleet idle: %d forwarders ÷ member, CPU", c.fleetBaseline), base.cpu, small.cpu),
				ratio(fmt.Sprintf("fleet idle: %d forwarders ÷ member, sessions (max)", c.fleetBaseline), base.sessionsMax, small.sessionsMax),
				ratio(fmt.Sprintf("fleet idle: %d forwarders ÷ member, transactions", c.fleetBaseline), base.xacts, small.xacts),
				ratio(fmt.Sprintf("fleet idle: %d forwarders ÷ member, RSS", c.fleetBaseline), base.rss, small.rss))
		}
		fmt.Print(table("idle: per tenant added, and the two kinds at the same number of tenants (paired by round)", derived))
		out = append(out, derived...)
		big := kinds[0].rows
		scale := float64(c.fleetTenants) / float64(c.fleetBaseline)
		fmt.Printf("  at %d tenants, stock forwarders scaled from %d (×%.0f): CPU %.2f s/min, %.0f sessions, %.0f xact/s; the member: %.2f s/min, %.0f sessions (max), %.0f xact/s\n",
			c.fleetTenants, c.fleetBaseline, scale, scale*base.cpu.median(), scale*base.sessionsMax.median(), scale*base.xacts.median(),
			big.cpu.median(), big.sessionsMax.median(), big.xacts.median())
	}
	if parts["join"] {
		fmt.Printf("\njoin, all %d samples: p50 %.0f ms, p99 %.0f ms, max %.0f ms (target: within 5 s)\n", len(joins),
			ms(percentile(joins, 50)), ms(percentile(joins, 99)), ms(percentile(joins, 100)))
		fmt.Print(table("join: per round", []series{joinP50, joinP99}))
		out = append(out, joinP50, joinP99)
	}
	return out, nil
}

// idleRun starts one relay process of kind k, warms its outboxes, and measures it idle (when
// idle) and then the join (when join).
func (b *fleetBench) idleRun(ctx context.Context, k idleRelays, rep int, idle, join bool) (idleFigures, []time.Duration, error) {
	c := b.c
	id := fmt.Sprintf("%s-%d-r%d-%s", k.kind, k.tenants, rep, b.tag)
	app := "outboxkit-bench-fleet-" + id
	tenants := b.tenants[:k.tenants]
	spec := fleetChildSpec{Kind: k.kind, URL: b.appURL(app), Broker: c.brokerURL}
	if k.kind == "member" {
		spec.Fleet, spec.Catalog, spec.Want = "bench-"+id, b.catalogQuery(k.tenants, app), k.tenants
	} else {
		spec.Schemas = tenants
	}
	warm, err := newArrivals(c.brokerURL, "bench.fleet.warm."+id, k.tenants)
	if err != nil {
		return idleFigures{}, nil, err
	}
	defer warm.close()
	child, err := startFleetChild(spec)
	if err != nil {
		return idleFigures{}, nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = child.stop()
		}
	}()
	if err := child.ready(); err != nil {
		return idleFigures{}, nil, err
	}
	// Traffic first: every outbox relays an event, its connections are open, as after a busy spell.
	if err := writeEvents(ctx, b.pool, tenants, warm.topic, nil); err != nil {
		return idleFigures{}, nil, err
	}
	if _, _, err := warm.wait(ctx, 2*time.Minute); err != nil {
		return idleFigures{}, nil, fmt.Errorf("warm-up: %w", err)
	}
	var f idleFigures
	if idle {
		if !sleepCtx(ctx, c.fleetSettle) {
			return idleFigures{}, nil, ctx.Err()
		}
		if f, err = b.measureIdle(ctx, child, app, k.tenants); err != nil {
			return idleFigures{}, nil, err
		}
	}
	var joins []time.Duration
	if join {
		if joins, err = b.join(ctx, id); err != nil {
			return idleFigures{}, nil, err
		}
	}
	stopped = true
	return f, joins, child.stop()
}

// measureIdle measures the relay process child (its sessions named app) for --idle-for.
func (b *fleetBench) measureIdle(ctx context.Context, child *fleetChild, app string, tenants int) (idleFigures, error) {
	s0, err := child.stats(false)
	if err != nil {
		return idleFigures{}, err
	}
	x0, n0, err := b.databaseStats(ctx)
	if err != nil {
		return idleFigures{}, err
	}
	sampler := b.sampleSessions(ctx, app)
	t0 := time.Now()
	if !sleepCtx(ctx, b.c.idleFor) {
		sampler.stop()
		return idleFigures{}, ctx.Err()
	}
	s1, err := child.stats(false)
	window := time.Since(t0)
	if err != nil {
		sampler.stop()
		return idleFigures{}, err
	}
	x1, n1, err := b.databaseStats(ctx)
	samples := sampler.stop()
	if err != nil {
		return idleFigures{}, err
	}
	if sampler.err != nil {
		return idleFigures{}, sampler.err
	}
	g, err := child.stats(true)
	if err != nil {
		return idleFigures{}, err
	}
	f := idleFigures{window: window, cpu: s1.CPU - s0.CPU, xacts: x1 - x0, newSessions: n1 - n0, rssKB: s1.RSSKB, heap: g.HeapAlloc,
		tenants: tenants, samples: len(samples)}
	total := 0
	for _, s := range samples {
		total += s.sessions
		f.sessionsMax = max(f.sessionsMax, s.sessions)
		f.listenMax = max(f.listenMax, s.listen)
	}
	if len(samples) > 0 {
		f.sessionsMean = float64(total) / float64(len(samples))
	}
	return f, nil
}

// databaseStats reads the bench database's transactions (committed and rolled back) and the
// sessions ever opened to it, from its pg_stat_database row: only the bench uses that database.
func (b *fleetBench) databaseStats(ctx context.Context) (xacts, sessions int64, err error) {
	err = b.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = $1`, b.dbName).
		Scan(&xacts, &sessions)
	return xacts, sessions, err
}

type sessionSample struct{ sessions, listen int }

// sessionSampler counts, every second, the sessions named app and those of them that LISTEN.
type sessionSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []sessionSample
	err     error
}

func (b *fleetBench) sampleSessions(ctx context.Context, app string) *sessionSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &sessionSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			var x sessionSample
			err := b.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query ILIKE 'listen%' OR query ILIKE 'unlisten%')
				FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&x.sessions, &x.listen)
			if err != nil {
				if ctx.Err() == nil {
					s.err = err
				}
				return
			}
			s.samples = append(s.samples, x)
			if !sleepCtx(ctx, time.Second) {
				return
			}
		}
	}()
	return s
}

func (s *sessionSampler) stop() []sessionSample {
	s.cancel()
	<-s.done
	return s.samples
}

// join adds the joiners to the catalog one at a time, each row committed with the tenant's
// first event, and times each event's arrival at the broker from that commit.
func (b *fleetBench) join(ctx context.Context, id string) ([]time.Duration, error) {
	arr, err := newArrivals(b.c.brokerURL, "bench.fleet.join."+id, 0)
	if err != nil {
		return nil, err
	}
	defer arr.close()
	defer func() {
		_, _ = b.pool.Exec(context.Background(), `DELETE FROM `+fleetCoordSchema+`.bench_tenants WHERE joiner`)
	}()
	var out []time.Duration
	for i, j := range b.joiners {
		// A pause of a random part of a tick first: joining right after the last arrival would
		// always land at the same moment of the member's tick.
		if !sleepCtx(ctx, rand.N(fleet.DefaultTick)) {
			return nil, ctx.Err()
		}
		if err := writeEvents(ctx, b.pool, []string{j}, arr.topic, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+fleetCoordSchema+`.bench_tenants (name, idx, joiner) VALUES ($1, $2, true)`, j, 1_000_000+i)
			return err
		}); err != nil {
			return nil, err
		}
		t0 := time.Now()
		at, err := arr.waitKey(ctx, j, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("join %d: %w", i+1, err)
		}
		out = append(out, at.Sub(t0))
	}
	return out, nil
}
