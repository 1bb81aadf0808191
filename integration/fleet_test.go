package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/tcpproxy"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// fleetMemberSpec is what TestHelperFleetMember, a member process, is told in its environment.
type fleetMemberSpec struct {
	CoordURL    string         `json:"coord_url"`
	CoordSchema string         `json:"coord_schema"`
	Fleet       string         `json:"fleet"`
	Member      string         `json:"member"`
	AMQP        string         `json:"amqp"`
	LeaseTTL    time.Duration  `json:"lease_ttl"`
	MaxConns    int            `json:"max_conns"`
	Outboxes    []fleet.Outbox `json:"outboxes"`
}

const envHelperFleet = "OUTBOXKIT_HELPER_FLEET"

// TestHelperFleetMember is a member of the fleet of TestFleet_RelayProcessesKilledCutOffAndTerminated,
// in a process of its own: it relays until SIGTERM, then releases its leases and exits 0.
func TestHelperFleetMember(t *testing.T) {
	raw := os.Getenv(envHelperFleet)
	if raw == "" {
		return // only meaningful as the subprocess
	}
	var spec fleetMemberSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("%s: %v", envHelperFleet, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	coord, err := store.Open(ctx, spec.CoordURL, store.OpenOptions{Schema: spec.CoordSchema, MaxConns: max(spec.MaxConns, 4)})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	m, err := fleet.New(fleet.Config{
		Fleet: spec.Fleet, Member: spec.Member, Coordination: coord,
		Catalog: fleet.Outboxes(spec.Outboxes), Open: fleetstores.Opener(fleetstores.MaxConns(spec.MaxConns)),
		Publisher: amqpPublisher(t, spec.AMQP), LeaseTTL: spec.LeaseTTL,
		Forwarder: forwarder.Config{PollInterval: 100 * time.Millisecond, IdlePollInterval: 500 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// fleetProc is a member process, its coordination connections through a proxy of its own.
type fleetProc struct {
	name   string
	proxy  *tcpproxy.Proxy
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer
	exited chan struct{}
	err    error
}

func (p *fleetProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *fleetProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Faults on a fleet of three member processes relaying ten Postgres schemas and two databases of
// their own into RabbitMQ while events are written to every one (OUTBOXKIT_FLEET_SCHEMAS,
// _DATABASES, _KILLS, _LEASE_TTL_MS and _MAX_CONNS size a longer soak: make chaos-fleet): kill -9 of a member (three times), its
// coordination connections frozen (a black hole), then terminated by the server again and again
// (pg_terminate_backend). Every outbox a lost member owned is relayed by another within the lease's
// term and a tick; nothing written is lost; and never do two owners publish for one outbox — checked
// from the fencing tokens of what reached the broker: once a token has arrived for an outbox, no
// message of a lower one arrives after it.
func TestFleet_RelayProcessesKilledCutOffAndTerminated(t *testing.T) {
	t.Parallel()
	var (
		schemas   = envInt(t, "OUTBOXKIT_FLEET_SCHEMAS", 10)
		databases = envInt(t, "OUTBOXKIT_FLEET_DATABASES", 2)
		kills     = envInt(t, "OUTBOXKIT_FLEET_KILLS", 3)
		leaseTTL  = time.Duration(envInt(t, "OUTBOXKIT_FLEET_LEASE_TTL_MS", 4000)) * time.Millisecond
		// maxConns bounds each member's connections per database (and to the coordination
		// database): the shared server allows 100 in all.
		maxConns = max(envInt(t, "OUTBOXKIT_FLEET_MAX_CONNS", 3), 1)
		tenants  = schemas + databases
		// takeoverBound is generous: the lease's term, a tick, and the time for a new owner's first
		// pass, with room for a loaded machine.
		takeoverBound = leaseTTL + 16*time.Second
	)
	ctx := context.Background()
	pgURL := testenv.PostgresURL(t)
	amqpURL := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "fleet")
	q := testenv.BindQueue(t, amqpURL, topic)
	coord := testenv.NewPG(t)
	fc, ok := store.FleetControlOf(coord.Store)
	if !ok {
		t.Fatal("pgxstore keeps no fleet")
	}
	fleetName := topic

	dbs, outboxes := fleetTenants(t, pgURL, schemas, databases)
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}

	start := func(name string) *fleetProc {
		t.Helper()
		proxy, err := tcpproxy.Listen(u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		cu := *u
		cu.Host = proxy.Addr()
		qv := cu.Query()
		qv.Set("application_name", "fleet-"+name)
		cu.RawQuery = qv.Encode()
		spec, _ := json.Marshal(fleetMemberSpec{CoordURL: cu.String(), CoordSchema: string(coord.Schema), Fleet: fleetName,
			Member: name, AMQP: amqpURL, LeaseTTL: leaseTTL, MaxConns: maxConns, Outboxes: outboxes})
		p := &fleetProc{name: name, proxy: proxy, exited: make(chan struct{})}
		p.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperFleetMember$", "-test.v")
		p.cmd.Env = append(os.Environ(), envHelperFleet+"="+string(spec))
		p.cmd.Stdout, p.cmd.Stderr = p, p
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.err = p.cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() {
			_ = p.cmd.Process.Kill()
			<-p.exited
			if t.Failed() {
				t.Logf("member %s:\n%s", p.name, p.output())
			}
		})
		return p
	}
	status := func() fleet.Status {
		t.Helper()
		st, err := fleet.ReadStatus(ctx, fc, fleetName)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	ownedBy := func(st fleet.Status) map[string][]string {
		m := map[string][]string{}
		for _, o := range st.Outboxes {
			if o.Owner != "" {
				m[o.Owner] = append(m[o.Owner], o.Name)
			}
		}
		return m
	}
	allOwned := func() bool {
		st := status()
		n := 0
		for _, o := range st.Outboxes {
			if o.Owner != "" {
				n++
			}
		}
		return n == tenants
	}

	live := []*fleetProc{start("m0-0"), start("m1-0"), start("m2-0")}
	testenv.Eventually(t, 60*time.Second, "every outbox owned", allOwned)

	// The writer: one event per transaction, round robin over the tenants, until stopped.
	var (
		wmu     sync.Mutex
		written = map[string]bool{}
	)
	wctx, stopWriting := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for n := 0; wctx.Err() == nil; n++ {
			db := dbs[n%tenants]
			msg := pipeline.NewEvent("Happened", fmt.Sprintf("key-%d", n%37), []byte(`{"n":`+strconv.Itoa(n)+`}`))
			err := pgx.BeginFunc(wctx, db.pool, func(tx pgx.Tx) error {
				pub, err := pipeline.NewPublisher(db.store, tx, pipeline.PublisherConfig{})
				if err != nil {
					return err
				}
				return pub.Publish(topic, msg)
			})
			if err == nil {
				wmu.Lock()
				written[msg.UUID] = true
				wmu.Unlock()
			}
			select {
			case <-wctx.Done():
			case <-tick.C:
			}
		}
	}()

	// relayedAgain waits until each of outboxes has a message at the broker with a token above the
	// one it had, and returns how long that took from since.
	relayedAgain := func(since time.Time, tokens map[string]int64) time.Duration {
		t.Helper()
		testenv.Eventually(t, takeoverBound, "the lost member's outboxes relayed by another", func() bool {
			seen := map[string]bool{}
			for _, d := range q.Received() {
				tok, _ := strconv.ParseInt(d.Headers[outboxkit.MetadataLeaseToken], 10, 64)
				if o := d.Headers[outboxkit.MetadataOutbox]; tok > tokens[o] {
					seen[o] = true
				}
			}
			for o := range tokens {
				if !seen[o] {
					return false
				}
			}
			return true
		})
		return time.Since(since)
	}
	tokensOf := func(st fleet.Status, names []string) map[string]int64 {
		m := map[string]int64{}
		for _, o := range st.Outboxes {
			if slices.Contains(names, o.Name) {
				m[o.Name] = o.Token
			}
		}
		return m
	}
	busiest := func() (*fleetProc, map[string]int64) {
		t.Helper()
		var victim *fleetProc
		var owned []string
		testenv.Eventually(t, 30*time.Second, "a member owning outboxes, all outboxes owned", func() bool {
			if !allOwned() {
				return false
			}
			by := ownedBy(status())
			victim, owned = nil, nil
			for _, p := range live {
				if len(by[p.name]) > len(owned) {
					victim, owned = p, by[p.name]
				}
			}
			return victim != nil
		})
		return victim, tokensOf(status(), owned)
	}
	// balanced waits until the newest member has taken its share, so that each kill takes a third.
	balanced := func(live []*fleetProc) {
		t.Helper()
		share := (tenants + len(live) - 1) / len(live)
		testenv.Eventually(t, 90*time.Second, "the fleet rebalanced over its members", func() bool {
			by := ownedBy(status())
			n := 0
			for _, p := range live {
				if len(by[p.name]) > share {
					return false
				}
				n += len(by[p.name])
			}
			return n == tenants
		})
	}
	without := func(ps []*fleetProc, p *fleetProc) []*fleetProc {
		return slices.DeleteFunc(slices.Clone(ps), func(x *fleetProc) bool { return x == p })
	}

	balanced(live)
	// kill -9 of the busiest member, kills times (3 by default); each time a new member takes its place.
	var takeovers []time.Duration
	for k := 1; k <= max(kills, 1); k++ {
		victim, tokens := busiest()
		at := time.Now()
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-victim.exited
		d := relayedAgain(at, tokens)
		takeovers = append(takeovers, d)
		t.Logf("kill -9 %d of %s: its %d outboxes relayed by others after %s", k, victim.name, len(tokens), d.Round(time.Millisecond))
		live = append(without(live, victim), start(fmt.Sprintf("m%d-%d", k%3, k)))
		balanced(live)
	}

	// A black hole between one member and the coordination database: it stops before its leases can
	// be taken, and another member relays them.
	victim, tokens := busiest()
	at := time.Now()
	victim.proxy.Freeze()
	d := relayedAgain(at, tokens)
	t.Logf("coordination cut off from %s: its %d outboxes relayed by others after %s", victim.name, len(tokens), d.Round(time.Millisecond))
	victim.proxy.Thaw()

	// The server terminates one member's coordination sessions again and again for five seconds.
	target := live[0]
	if target == victim {
		target = live[1]
	}
	end := time.Now().Add(5 * time.Second)
	terminated := 0
	for time.Now().Before(end) {
		var n int
		if err := coord.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
			"fleet-"+target.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		terminated += n
		pause := time.NewTimer(300 * time.Millisecond)
		<-pause.C
	}
	t.Logf("terminated %d coordination sessions of %s", terminated, target.name)
	if terminated == 0 {
		t.Fatalf("no session of %s was terminated: the fault did not happen", target.name)
	}

	stopWriting()
	<-writerDone
	wmu.Lock()
	want := len(written)
	wmu.Unlock()
	testenv.Eventually(t, 90*time.Second, "every written event at the broker", func() bool {
		got := map[string]bool{}
		for _, d := range q.Received() {
			got[d.UUID] = true
		}
		for id := range written {
			if !got[id] {
				return false
			}
		}
		return true
	})

	// Nothing lost (above); duplicates only what was in flight; never two owners at once.
	got := q.Received()
	counts := countByUUID(got)
	dups := 0
	for id := range written {
		dups += counts[id] - 1
	}
	highest := map[string]int64{}
	stale := 0
	for _, d := range got {
		o := d.Headers[outboxkit.MetadataOutbox]
		tok, err := strconv.ParseInt(d.Headers[outboxkit.MetadataLeaseToken], 10, 64)
		if o == "" || err != nil {
			t.Fatalf("message %s lacks its fleet stamps: %v", d.UUID, d.Headers)
		}
		if d.Headers[outboxkit.MetadataTenant] != o {
			t.Fatalf("message %s of outbox %s carries tenant %q", d.UUID, o, d.Headers[outboxkit.MetadataTenant])
		}
		if tok < highest[o] {
			stale++
			t.Errorf("outbox %s: a message of token %d (member %s) arrived after one of token %d", o, tok,
				d.Headers[outboxkit.MetadataRelayMember], highest[o])
		}
		highest[o] = max(highest[o], tok)
	}
	slices.Sort(takeovers)
	t.Logf("%d outboxes (%d schemas, %d databases), %d events written, %d delivered, %d duplicates, %d published by a stale owner; "+
		"kill -9 takeovers with a %s lease: p50 %s, max %s over %d",
		tenants, schemas, databases, want, len(got), dups, stale, leaseTTL, takeovers[len(takeovers)/2].Round(time.Millisecond),
		takeovers[len(takeovers)-1].Round(time.Millisecond), len(takeovers))

	// SIGTERM: each member finishes, releases its leases and exits 0.
	for _, p := range live {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range live {
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("member %s did not exit within 30s of SIGTERM", p.name)
		}
		if p.err != nil {
			t.Fatalf("member %s exited with %v after SIGTERM:\n%s", p.name, p.err, p.output())
		}
	}
	leases, now, err := fc.FleetLeases(ctx, fleetName)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Held(now) {
			t.Errorf("outbox %s still held by %s after every member stopped", l.Outbox, l.Owner)
		}
	}
}

// fleetTenant is one outbox of the fleet's test, as the test's writer reaches it.
type fleetTenant struct {
	pool  *pgxpool.Pool
	store *pgxstore.Store
}

// fleetTenants makes schemas outboxes as schemas of the test database, written through one pool,
// and databases outboxes each in a database of its own, all dropped when the test ends.
func fleetTenants(t *testing.T, pgURL string, schemas, databases int) ([]fleetTenant, []fleet.Outbox) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var (
		tenants  []fleetTenant
		outboxes []fleet.Outbox
	)
	add := func(pool *pgxpool.Pool, url, schema string) {
		st, err := pgxstore.New(pool, pgxstore.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Migrate(ctx); err != nil {
			t.Fatalf("migrate %s: %v", schema, err)
		}
		tenants = append(tenants, fleetTenant{pool: pool, store: st})
		outboxes = append(outboxes, fleet.Outbox{Name: fmt.Sprintf("tenant-%03d", len(outboxes)), URL: url, Schema: schema})
	}
	for range schemas {
		schema := testenv.UniqueName(t, "ft")
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop schema %s: %v", schema, err)
			}
		})
		add(pool, pgURL, schema)
	}
	for range databases {
		name := testenv.UniqueName(t, "ftdb")
		if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Errorf("drop database %s: %v", name, err)
			}
		})
		u, err := url.Parse(pgURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + name
		cfg, err := pgxpool.ParseConfig(u.String())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		dbPool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dbPool.Close)
		add(dbPool, u.String(), "outboxkit")
	}
	return tenants, outboxes
}

// envInt is the integer in the environment variable name, or def when it is unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}
