package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// lockedRand is a seeded source the load's goroutines share.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

func run(ctx context.Context, o options) (ok bool, err error) {
	seed := o.seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	logf := func(format string, args ...any) {
		if !o.quiet {
			fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
		}
	}
	e, err := setUp(ctx, o)
	if err != nil {
		return false, err
	}
	defer e.tearDown()
	fmt.Printf("chaos: store %s, broker %s, %s of orders at %g/s, faults every %s on average, seed %d, run %s, logs in %s\n",
		o.store, o.brokerLabel(), o.duration, o.rate, o.faultEvery, seed, e.run, e.dir)

	port, err := freePort()
	if err != nil {
		return false, err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	common := func(role string) []string {
		// The library's warnings and errors, and its info lines (a consumer group's assignments,
		// a relay's circuit), in each process's log: what a stall in the soak is read from.
		args := []string{"--db", e.dbURL(role), "--broker", e.brokerURL, "--schema", e.run,
			"--status-every", "0", "--serve", "--orders", "0", "--log-level", "info"}
		if o.relay == "log" { // every process: in WAL mode the order service's writers emit into the log
			args = append(args, "--relay", "log", "--relay-mode", o.relayMode, "--relay-group", relayGroup)
		}
		return args
	}
	var procs []*proc
	newBinP := func(bin, name string, args ...string) *proc {
		p, perr := newProc(e.dir, name, bin, args...)
		if perr != nil && err == nil {
			err = perr
		}
		procs = append(procs, p)
		return p
	}
	newP := func(name string, args ...string) *proc { return newBinP(e.demo, name, args...) }
	orders := newP("orders", append(common("orders"), "--role", "orders", "--addr", "127.0.0.1:"+strconv.Itoa(port),
		"--poison-customer", poisonCustomer)...)
	var relays, consumerProcs []*proc
	var self string // with --kafka-txn the relay processes are this binary's (txnrelay.go)
	if o.kafkaTxn {
		if self, err = os.Executable(); err != nil {
			return false, fmt.Errorf("--kafka-txn runs this binary as the relay processes: %w", err)
		}
	}
	for i := 1; i <= o.relays; i++ {
		name := fmt.Sprintf("relay-%d", i)
		if o.kafkaTxn { // in the run's relay group
			args := []string{txnRelayCommand, "--db", e.dbURL(fmt.Sprintf("relay%d", i)), "--schema", e.run,
				"--broker", e.txnBrokerURL(), "--name", name}
			if o.crashAfterPublish > 0 {
				args = append(args, "--crash-after-publish", strconv.Itoa(o.crashAfterPublish))
			}
			p := newBinP(self, name, args...)
			p.countLines(txnFaultOpen, txnFaultCommitted, txnRecovered)
			relays = append(relays, p)
			continue
		}
		args := append(common(fmt.Sprintf("relay%d", i)), "--role", "relay", "--relay-name", name, "--addr", "127.0.0.1:0")
		if o.crashAfterPublish > 0 {
			args = append(args, "--crash-after-publish", strconv.Itoa(o.crashAfterPublish))
		}
		relays = append(relays, newP(name, args...))
	}
	for _, c := range consumers {
		for i := 1; i <= o.replicas; i++ {
			name := c // one process per consumer keeps the consumer's name
			if o.replicas > 1 {
				name = fmt.Sprintf("%s-%d", c, i)
			}
			args := append(common(name), "--role", "consumers", "--consumers", c, "--addr", "127.0.0.1:0",
				"--gateway", base+"/gateway/charges")
			if o.unacked > 1 {
				args = append(args, "--unacked", strconv.Itoa(o.unacked))
			}
			if o.broker == "kafka" {
				// A static member: a consumer killed and restarted gets its partitions back without
				// stopping its group.
				args = append(args, "--kafka-instance-id", name)
			}
			if c == "billing" && o.crashAfterCharge > 0 {
				args = append(args, "--crash-after-charge-every", strconv.Itoa(o.crashAfterCharge))
			}
			if o.noInbox {
				args = append(args, "--no-inbox")
			}
			p := newP(name, args...)
			p.consumer = c
			consumerProcs = append(consumerProcs, p)
		}
	}
	if err != nil {
		return false, err
	}
	restartDelay := func() time.Duration { return 200*time.Millisecond + rand.N(1800*time.Millisecond) }
	defer func() {
		for _, p := range procs {
			p.stop(10 * time.Second)
		}
	}()

	// The order service first: it migrates and creates the tables the others use.
	if err := orders.start(restartDelay); err != nil {
		return false, err
	}
	if err := waitHealthy(ctx, base, 90*time.Second); err != nil {
		return false, fmt.Errorf("the order service: %w (see %s)", err, orders.log.Name())
	}
	for _, p := range append(relays, consumerProcs...) {
		if err := p.start(restartDelay); err != nil {
			return false, err
		}
	}

	admin, err := e.adminDB(ctx)
	if err != nil {
		return false, err
	}
	defer admin.Close()
	if o.relay == "log" {
		// In WAL mode the writers refuse until a log relay has made its slot: the load waits for it
		// (and, on MySQL, for the binlog relay's first checkpoint).
		if err := e.waitLogRelay(ctx, admin.SQL, 90*time.Second); err != nil {
			return false, fmt.Errorf("the log relay: %w (see %s)", err, relays[0].log.Name())
		}
	}
	biz := newTables(admin, e.run)
	gatewayDB := admin
	if o.store == "sqlite" { // a file of its own
		if gatewayDB, err = e.checkerDB(ctx, e.run+"_gateway"); err != nil {
			return false, err
		}
		defer gatewayDB.Close()
	}
	gateway := newTables(gatewayDB, e.run+"_gateway")

	// Load and faults, together, for o.duration.
	l := newLedger()
	var machineLoad loadWatch
	loadEnd := time.Now().Add(o.duration)
	cl := &client{base: base, http: &http.Client{Timeout: 15 * time.Second}, l: l, o: o,
		rnd: (&lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}).Float64, giveUp: loadEnd.Add(o.drain / 2)}
	in := &injector{e: e, rnd: rand.New(rand.NewPCG(seed, 1)), relays: relays, consumer: consumerProcs, orders: orders,
		admin: admin.SQL, log: logf, counts: map[string]int{}}
	loadCtx, stopLoad := context.WithDeadline(ctx, loadEnd)
	defer stopLoad()
	var faultsDone sync.WaitGroup
	faultsDone.Add(1)
	go func() { defer faultsDone.Done(); in.run(loadCtx) }()
	progress := startProgress(loadCtx, logf, l, biz, &machineLoad)
	cl.offer(loadCtx)
	faultsDone.Wait()
	progress()
	if ctx.Err() != nil {
		return false, ctx.Err()
	}

	// The drain: faults stop, every process is up again (the supervisors restart them), the
	// clients settle what is still unanswered, and every consumer handles every event.
	logf("load over: %d orders answered; draining (at most %s)", len(l.placed), o.drain)
	drainStart := time.Now()
	cl.wg.Wait()
	expected := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		ids := map[string]bool{}
		for _, v := range l.placed {
			ids[v[0]] = true
		}
		return len(ids) + len(l.cancelled)
	}()
	drained := false
	for time.Since(drainStart) < o.drain && ctx.Err() == nil {
		n, pending, herr := handled(ctx, biz)
		if herr == nil && pending == 0 && n["shipping"] >= expected && n["billing"] >= expected && n["search"] >= expected {
			drained = true
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	logf("drain %s after %s", map[bool]string{true: "complete", false: "INCOMPLETE"}[drained], time.Since(drainStart).Round(100*time.Millisecond))
	for _, p := range procs {
		p.stop(10 * time.Second)
	}

	v, err := check(context.WithoutCancel(ctx), biz, gateway, l, o.relay == "log")
	if err != nil {
		return false, fmt.Errorf("the checker: %w", err)
	}
	// On Kafka, the topic as a consumer without an inbox reads it, held against the outbox's rows
	// (which the log relay does not leave).
	var raw *rawVerdict
	if o.broker == "kafka" && o.relay == "poll" {
		recs, err := readCommitted(context.WithoutCancel(ctx), e.brokerURL, e.run+".orders")
		if err != nil {
			return false, fmt.Errorf("the checker's read_committed reader: %w", err)
		}
		rv, err := checkReadCommitted(context.WithoutCancel(ctx), biz, recs, o.kafkaTxn, v)
		if err != nil {
			return false, fmt.Errorf("the checker: %w", err)
		}
		raw = &rv
	}
	report(o, in, procs, relays, consumerProcs, l, v, raw, drained, machineLoad.highest())
	return v.violations() == 0 && drained && len(in.errors) == 0, nil
}

// relayGroup is the log relay processes' group: one of them reads, the others stand by.
const relayGroup = "demo"

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func waitHealthy(ctx context.Context, base string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy within %s: %v", within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// loadWatch keeps the highest 1-minute load average seen while the load runs (0 where
// /proc/loadavg cannot be read).
type loadWatch struct {
	mu  sync.Mutex
	max float64
}

// sample reads the 1-minute load average, records it and returns it (-1 when unreadable).
func (w *loadWatch) sample() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	w.mu.Lock()
	w.max = max(w.max, v)
	w.mu.Unlock()
	return v
}

func (w *loadWatch) highest() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}

// startProgress prints a line every 10 s while the load runs, with the machine's load average.
func startProgress(ctx context.Context, logf func(string, ...any), l *ledger, biz tables, load *loadWatch) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			l.mu.Lock()
			placed := len(l.placed)
			l.mu.Unlock()
			n, pending, err := handled(ctx, biz)
			if err != nil {
				logf("progress: %d orders answered; the database did not answer: %v", placed, err)
				continue
			}
			logf("progress: %d orders answered, %d POSTs retried; outbox pending %d; handled shipping %d billing %d search %d; load %.1f",
				placed, l.retries.Load(), pending, n["shipping"], n["billing"], n["search"], load.sample())
		}
	}()
	return func() { <-done }
}

func report(o options, in *injector, procs, relays, consumerProcs []*proc, l *ledger, v *verdict, raw *rawVerdict, drained bool, load float64) {
	held := "yes"
	if v.violations() > 0 || !drained {
		held = "NO"
	}
	sum := func(ps []*proc) (n int64) {
		for _, p := range ps {
			n += p.faultLines.Load()
		}
		return n
	}
	var charges int64 // Billing's exits after a charge, over its processes
	for _, p := range consumerProcs {
		if p.consumer == "billing" {
			charges += p.faultLines.Load()
		}
	}
	rows := [][2]string{}
	for _, k := range []string{faultKillRelay, faultKillConsumer, faultKillOrders, faultBrokerConns, faultBrokerRestart, faultDBSessions} {
		n, ok := in.counts[k]
		switch {
		case ok:
			rows = append(rows, [2]string{k, strconv.Itoa(n)})
		case k == faultDBSessions && o.store == "sqlite":
			rows = append(rows, [2]string{k, "n/a (SQLite)"})
		case k == faultBrokerRestart && !o.brokerRestart:
			rows = append(rows, [2]string{k, "off (--broker-restart)"})
		default:
			rows = append(rows, [2]string{k, "0"})
		}
	}
	lines := func(ps []*proc, marker string) (n int64) {
		for _, p := range ps {
			n += p.lines(marker)
		}
		return n
	}
	var fenced int64
	for _, p := range relays {
		fenced += p.fencedExits.Load()
	}
	if o.kafkaTxn {
		rows = append(rows,
			[2]string{faultTxnOpen, strconv.FormatInt(lines(relays, txnFaultOpen), 10)},
			[2]string{faultTxnCommitted, strconv.FormatInt(lines(relays, txnFaultCommitted), 10)},
			[2]string{faultTxnFenced, strconv.FormatInt(fenced, 10)})
	} else {
		rows = append(rows, [2]string{faultPublishNoMark, strconv.FormatInt(sum(relays), 10)})
	}
	rows = append(rows,
		[2]string{faultChargeNoCommit, strconv.FormatInt(charges, 10)},
		[2]string{faultPoison, strconv.Itoa(v.poisoned)},
		[2]string{faultRepeat, strconv.FormatInt(l.repeats.Load(), 10)},
		[2]string{faultRetry, strconv.FormatInt(l.retries.Load(), 10)},
	)
	fmt.Printf("\nfailure matrix — %s + %s, %s at %g orders/s\n", o.store, o.brokerLabel(), o.duration, o.rate)
	fmt.Printf("%-50s %-24s %s\n", "fault", "times injected", "invariants held")
	for _, r := range rows {
		fmt.Printf("%-50s %-24s %s\n", r[0], r[1], held)
	}
	fmt.Printf("\n%-100s %8s %10s\n", "invariant", "checked", "violations")
	for _, iv := range v.invariants {
		fmt.Printf("%-100s %8d %10d\n", iv.name, iv.checked, iv.violations)
		for _, ex := range iv.examples {
			fmt.Printf("    e.g. %s\n", ex)
		}
	}
	var restarts []string
	for _, p := range procs {
		restarts = append(restarts, fmt.Sprintf("%s %d", p.name, p.starts.Load()-1))
	}
	fmt.Printf("\norders %d (poisoned %d, cancelled %d); POSTs sent %d, repeated %d, retried %d, answered from the record %d\n",
		v.orders, v.poisoned, v.cancelled, l.posts.Load(), l.repeats.Load(), l.retries.Load(), l.replayed.Load())
	fmt.Printf("effects missed %d, doubled %d; restarts: %s\n", v.misses, v.doubles, strings.Join(restarts, ", "))
	if raw != nil {
		dup := "a violation: each pass is one transaction"
		if !o.kafkaTxn {
			dup = "information without transactions: a relay dead between publish and mark is published again; the inboxes absorb it"
		}
		fmt.Printf("read_committed without an inbox (franz-go, the topic from its start): %d records of %d published events: "+
			"%d duplicates (%s), %d gaps, %d inversions, %d other records\n",
			raw.records, raw.events, raw.duplicates, dup, raw.missing, raw.inversions, raw.foreign)
	}
	if o.kafkaTxn {
		var selfExits int64
		for _, p := range relays {
			selfExits += p.selfExits.Load()
		}
		fmt.Printf("transactional relay group %s: %d relay processes, %d killed by the soak, %d exits of their own (%d killed with the "+
			"transaction open, %d after the commit, %d fenced); %d transactions a dead relay committed, recorded by its successor\n",
			in.e.run, len(relays), in.counts[faultKillRelay], selfExits, lines(relays, txnFaultOpen), lines(relays, txnFaultCommitted), fenced,
			lines(relays, txnRecovered))
	}
	fmt.Printf("commit→effect (OrderPlaced, every consumer): p50 %s, p99 %s, slowest %s\n",
		percentile(v.latency, 0.5).Round(time.Millisecond), percentile(v.latency, 0.99).Round(time.Millisecond),
		percentile(v.latency, 1).Round(time.Millisecond))
	var each []string
	for _, c := range consumers {
		l := v.latencyOf[c]
		each = append(each, fmt.Sprintf("%s p50 %s, p99 %s, slowest %s", c, percentile(l, 0.5).Round(time.Millisecond),
			percentile(l, 0.99).Round(time.Millisecond), percentile(l, 1).Round(time.Millisecond)))
	}
	fmt.Printf("commit→effect per consumer: %s\n", strings.Join(each, "; "))
	if load > 0 {
		// Not judged: the soak's own processes (and on RabbitMQ, each rabbitmqctl) keep the load
		// at 5–14 on 2 cores by themselves; a build or a benchmark beside it shows as the consumers'
		// handled counts falling behind in the progress lines, at the load they print.
		fmt.Printf("machine: highest 1-minute load average %.1f on %d cores during the load\n", load, runtime.NumCPU())
	}
	for _, e := range in.errors {
		fmt.Printf("a fault could not be injected: %s\n", e)
	}
	switch {
	case !drained:
		fmt.Printf("RESULT: FAILED — the system did not settle within --drain %s, and %d violations\n", o.drain, v.violations())
	case v.violations() > 0:
		fmt.Printf("RESULT: FAILED — %d violations\n", v.violations())
	case len(in.errors) > 0:
		fmt.Printf("RESULT: FAILED — %d faults could not be injected\n", len(in.errors))
	default:
		fmt.Println("RESULT: every invariant held")
	}
}
