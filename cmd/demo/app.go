package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every database URL
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
)

// openStore opens --db. With --relay-mode wal its writers emit each event into the write-ahead log
// instead of an outbox row (pgsqlstore.Config.WAL), for the log relay in WAL mode; store.Open has
// no option for it, so the store is built here as store.Open builds it.
func openStore(ctx context.Context, o options) (*store.DB, error) {
	if o.relayMode != string(pglog.ModeWAL) {
		return store.Open(ctx, o.dbURL, store.OpenOptions{Schema: o.schema})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sqlDB, err := sql.Open("pgx", o.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", redact(o.dbURL), err)
	}
	sqlDB.SetMaxOpenConns(store.DefaultMaxConns)
	s, err := pgsqlstore.New(sqlDB, pgsqlstore.Config{Schema: o.schema, ListenURL: o.dbURL, WAL: true})
	return store.Finish(ctx, sqlDB, s, err, "postgres", o.dbURL, nil)
}

// relayControl runs the relay (the forwarder's Run, or the log relay's) and lets /admin/relay
// stop and start it.
type relayControl struct {
	run func(context.Context) error
	// stopped is told why the relay stopped by itself — fenced by a newer relay of its Kafka
	// relay group, or refused at start — not when stop ended it.
	stopped func(error)
	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
}

func (c *relayControl) start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return
	}
	runCtx, cancel := context.WithCancel(ctx)
	c.cancel, c.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if err := c.run(runCtx); err != nil && runCtx.Err() == nil && c.stopped != nil {
			c.stopped(err)
		}
	}(c.done)
}

func (c *relayControl) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.done
	c.cancel = nil
}

func (c *relayControl) running() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancel != nil
}

func run(ctx context.Context, o options) (err error) {
	// A relay that stops by itself ends the demo with its error: a process of its own, it exits
	// for its supervisor to restart it.
	var relayFailed atomic.Pointer[error]
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	defer func() {
		if rerr := relayFailed.Load(); rerr != nil {
			err = fmt.Errorf("the relay stopped: %w", *rerr)
		}
	}()
	db, err := openStore(ctx, o)
	if err != nil {
		return fmt.Errorf("%w (pass --db; the default, %s, needs no server)", err, defaultDB)
	}
	defer db.Close()
	res, err := pipeline.Migrate(ctx, db)
	if err != nil {
		return err
	}
	biz := newBusiness(db)
	if err := biz.createTables(ctx); err != nil {
		return err
	}

	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	switch {
	case o.verbose:
		logger = watermill.NewStdLogger(true, false)
	case o.logLevel != "":
		logger = watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevels[o.logLevel]})))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The schema names the topic on SQLite too (its file holds outboxkit's tables, not a
	// schema): two demos on one broker keep to their own.
	topic := o.schema + ".orders"
	if db.Dialect != "sqlite" {
		topic = db.Info().Schema + ".orders"
	}
	// The publisher declares each consumer group's queue before it first publishes (RabbitMQ), so a
	// consumer that starts after the orders service misses nothing.
	groups := make([]string, len(consumerNames))
	for i, c := range consumerNames {
		groups[i] = c.name
	}
	unacked := 0 // the broker's default, one at a time (and no option where the broker has none)
	if o.unacked > 1 {
		unacked = o.unacked
	}
	broker, err := backends.Open(ctx, o.brokerURL, backends.Options{Logger: logger, Consumers: map[string][]string{topic: groups},
		KafkaInstanceID: o.kafkaInstanceID, Unacked: unacked})
	if err != nil {
		return fmt.Errorf("cannot open the broker at %s: %w (pass --broker)", redact(o.brokerURL), err)
	}
	defer broker.Close()
	if broker.ReportsLag() {
		biz.lag = func(ctx context.Context, group string) (backends.Lag, error) { return broker.Lag(ctx, topic, group) }
		reg.MustRegister(prom.NewLagCollector(broker, topic, groups...))
	}
	var runRelay func(context.Context) error
	var reading <-chan struct{} // the log relay's: closed once it reads its slot, or the binary log
	if o.runs(roleRelay) {
		faulty := &faultyPublisher{Publisher: broker.Publisher, failEvery: o.failPublishEvery, crashEvery: o.crashAfterPublish}
		var pub message.Publisher = faulty
		if tp, ok := broker.Publisher.(forwarder.TransactionalPublisher); ok {
			pub = &faultyTxnPublisher{faultyPublisher: faulty, txn: tp} // kafka://…?transactional_id=
		}
		name := o.relayName
		if o.relay == relayLog {
			name = o.relayGroup // it names the slot the group's relays share
		}
		relay, err := forwarder.New(forwarder.Config{
			Store: db, Name: name, Publisher: pub, Metrics: prom.NewForwarderMetrics(reg), Logger: logger,
			Backoff: forwarder.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2},
		})
		if err != nil {
			return err
		}
		runRelay = relay.Run
		switch {
		case o.relay == relayLog && o.dialect() == "mysql":
			lr, err := mysqlbinlog.New(mysqlbinlog.Config{Forwarder: relay, URL: o.dbURL})
			if err != nil {
				return err
			}
			reg.MustRegister(prom.NewBinlogCollector(lr))
			runRelay, reading = lr.Run, lr.Reading()
			if o.crashAfterPublish > 0 {
				faults.InjectBeforeConfirm(lr, faulty.beforeConfirm)
			}
		case o.relay == relayLog:
			pool, err := pgxpool.New(ctx, o.dbURL)
			if err != nil {
				return fmt.Errorf("the log relay's connections: %w", err)
			}
			defer pool.Close()
			lr, err := pglog.New(pglog.Config{Forwarder: relay, Pool: pool, Mode: pglog.Mode(o.relayMode)})
			if err != nil {
				return err
			}
			reg.MustRegister(prom.NewSlotCollector(lr))
			runRelay, reading = lr.Run, lr.Reading()
			if o.crashAfterPublish > 0 {
				faults.InjectBeforeConfirm(lr, faulty.beforeConfirm)
			}
		case o.crashAfterPublish > 0:
			faults.Inject(relay, faults.AfterPublish, faulty.afterPublish)
		}
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	// Watermill's own handler metrics (execution time, messages per handler) beside outboxkit's.
	metrics.NewPrometheusMetricsBuilder(reg, "demo", "").AddPrometheusRouterMetrics(router)
	// Listening before the consumers start: Billing's first charges queue in the listen backlog
	// until the server serves.
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (another demo running? pass --addr)", o.addr, err)
	}
	defer ln.Close()
	base := "http://" + ln.Addr().String()
	var gateway http.Handler
	if o.runs(roleOrders) {
		gatewayDB, err := openGateway(ctx, o, db.Dialect)
		if err != nil {
			return err
		}
		defer gatewayDB.Close()
		if gateway, err = gatewayHandler(gatewayDB, logger); err != nil {
			return err
		}
	}
	if o.runs(roleConsumers) {
		gatewayURL := o.gatewayURL
		if gatewayURL == "" {
			gatewayURL = base + "/gateway/charges"
		}
		billing := &gatewayClient{url: gatewayURL, http: &http.Client{Timeout: 10 * time.Second}}
		if err := addConsumers(router, biz, broker, topic, reg, billing, o, logger); err != nil {
			return err
		}
	}
	if o.runs(roleConsumers) { // (a router with no handlers would never finish closing)
		routerCtx, stopRouter := context.WithCancel(context.Background())
		routerDone := make(chan error, 1)
		go func() { routerDone <- router.Run(routerCtx) }()
		defer func() {
			stopRouter()
			if err := <-routerDone; err != nil {
				logger.Error("The consumers' router stopped", err, nil)
			}
		}()
		if err := waitRunning(ctx, router); err != nil {
			return err
		}
	}
	var control *relayControl
	if runRelay != nil {
		control = &relayControl{run: runRelay, stopped: func(err error) {
			relayFailed.Store(&err)
			cancelRun()
		}}
		control.start(context.Background())
		defer control.stop()
	}

	idem, err := idempotency.Middleware(idempotency.Config{Store: db, Logger: logger})
	if err != nil {
		return err
	}
	orders := &orderService{b: biz, topic: topic, poisonEvery: o.poisonEvery, poisonCustomer: o.poisonCustomer}
	mux := http.NewServeMux()
	if o.runs(roleOrders) {
		mux.Handle("POST /orders", idem(http.HandlerFunc(orders.create)))
		mux.Handle("POST /orders/{id}/cancel", idem(http.HandlerFunc(orders.cancel)))
		mux.HandleFunc("GET /orders/{id}", orders.get)
		mux.Handle("POST /gateway/charges", gateway)
	}
	if o.console {
		h, err := newConsole(ctx, db, broker, topic)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = h.Stop(sctx)
		}()
		mux.Handle("/console/", h)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) })
	mux.HandleFunc("GET /readyz", readiness(db, control, o.readyMaxAge))
	if control != nil {
		mux.HandleFunc("POST /admin/relay/stop", func(w http.ResponseWriter, r *http.Request) {
			control.stop()
			writeJSON(w, 200, map[string]bool{"relay_running": false})
		})
		mux.HandleFunc("POST /admin/relay/start", func(w http.ResponseWriter, r *http.Request) {
			control.start(context.Background())
			writeJSON(w, 200, map[string]bool{"relay_running": true})
		})
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Printf("outboxkit demo on %s — POST /orders, POST /orders/{id}/cancel, GET /orders/{id}, /metrics, /healthz, /readyz; payment gateway POST /gateway/charges\n", base)
	if o.console {
		fmt.Printf("operator console on %s/console/\n", base)
	}
	fmt.Printf("%s %s at version %d; broker %s; consumers %s\n", db.Info().Name, db.Info().Schema, res.Version, redact(o.brokerURL),
		strings.Join([]string{consumerNames[0].name, consumerNames[1].name, consumerNames[2].name}, ", "))
	printFaults(o)

	stopStatus := startStatusLine(ctx, biz, o)
	defer stopStatus()

	if o.orders > 0 && reading != nil {
		// In WAL mode the writers refuse until the relay has made its slot; in table mode (and
		// with the binlog relay) the status lines would show the events waiting for it.
		select {
		case <-reading:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(60 * time.Second):
			if o.dialect() == "mysql" {
				return errors.New("the binlog relay did not read the binary log within 60s: does another relay process of --relay-group " +
					o.relayGroup + " hold its lock? see its log above (--log-level info)")
			}
			return errors.New("the log relay did not read its replication slot within 60s: is wal_level = logical? see its log above (--verbose)")
		}
	}
	if o.orders > 0 {
		before, err := takeSnapshot(ctx, biz)
		if err != nil {
			return err
		}
		gen, err := placeSampleOrders(ctx, base, o)
		if err != nil {
			return err
		}
		fmt.Printf("placed %d orders (%d POSTs retried with the same Idempotency-Key, %d answered from its record)\n",
			gen.placed, gen.retried, gen.replayed)
		after, err := waitDrained(ctx, biz, o, before, gen.placed)
		stopStatus()
		fmt.Println(after.line())
		if err != nil {
			return err
		}
		fmt.Println(summary(o, before, after, gen.placed))
	}
	if o.serve {
		fmt.Println("serving until interrupted (Ctrl-C)")
		<-ctx.Done()
	}
	return nil
}

func printFaults(o options) {
	var on []string
	if o.failPublishEvery > 0 {
		on = append(on, fmt.Sprintf("--fail-publish-every %d", o.failPublishEvery))
	}
	if o.crashAfterPublish > 0 {
		on = append(on, fmt.Sprintf("--crash-after-publish %d", o.crashAfterPublish))
	}
	if o.poisonEvery > 0 {
		on = append(on, fmt.Sprintf("--poison-every %d", o.poisonEvery))
	}
	if o.poisonCustomer != "" {
		on = append(on, fmt.Sprintf("--poison-customer %q", o.poisonCustomer))
	}
	if o.noInbox {
		on = append(on, "--no-inbox")
	}
	if o.consumerCrash > 0 {
		on = append(on, fmt.Sprintf("--consumer-crash-every %d", o.consumerCrash))
	}
	if o.crashAfterCharge > 0 {
		on = append(on, fmt.Sprintf("--crash-after-charge-every %d", o.crashAfterCharge))
	}
	if o.rejectCustomer != "" {
		on = append(on, fmt.Sprintf("--reject-customer %q", o.rejectCustomer))
	}
	if len(on) > 0 {
		fmt.Println("faults on:", strings.Join(on, ", "))
	}
}

func readiness(db *store.DB, control *relayControl, maxAge time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st, err := db.OutboxStats(r.Context(), time.Now())
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": "database: " + err.Error()})
			return
		}
		body := map[string]any{"ready": true, "pending": st.Pending, "oldest_pending_age_seconds": st.OldestPendingAge.Seconds(),
			"relay_running": control.running()}
		if st.OldestPendingAge > maxAge {
			body["ready"] = false
			body["reason"] = fmt.Sprintf("the oldest pending event is %s old (limit %s): the relay is not keeping up or not running",
				st.OldestPendingAge.Round(time.Second), maxAge)
			writeJSON(w, http.StatusServiceUnavailable, body)
			return
		}
		writeJSON(w, http.StatusOK, body)
	}
}

func startStatusLine(ctx context.Context, b *business, o options) (stop func()) {
	if o.statusEvery <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(o.statusEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s, err := takeSnapshot(ctx, b); err == nil {
				fmt.Printf("[%4.0fs] %s\n", time.Since(start).Seconds(), s.line())
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// waitDrained waits until every consumer has handled the placed orders (processed or dead-lettered).
func waitDrained(ctx context.Context, b *business, o options, before snapshot, placed int) (snapshot, error) {
	deadline := time.Now().Add(o.drainDeadline)
	for {
		s, err := takeSnapshot(ctx, b)
		if err != nil {
			return s, err
		}
		handled := true
		for _, c := range consumerNames {
			if s.Processed[c.name]-before.Processed[c.name]+(s.InboxDeadLetters-before.InboxDeadLetters)/int64(len(consumerNames)) < int64(placed) {
				handled = false
			}
		}
		if handled && s.Pending == 0 {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("not every consumer handled the %d orders within %s: see GET /orders/{id} or outboxctl status", placed, o.drainDeadline)
		}
		select {
		case <-ctx.Done():
			return s, errors.New("interrupted")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func summary(o options, before, after snapshot, placed int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "done: %d orders placed;", placed)
	for _, c := range consumerNames {
		fmt.Fprintf(&b, " %s %d,", c.name, after.Processed[c.name]-before.Processed[c.name])
	}
	fmt.Fprintf(&b, " duplicates absorbed %d, dead letters %d.", after.Duplicates-before.Duplicates, after.InboxDeadLetters-before.InboxDeadLetters)
	if o.poisonEvery > 0 {
		fmt.Fprintf(&b, "\nthe poisoned events are dead-lettered: try `go run ./cmd/outboxctl --db '%s' --schema %s inbox dead list`", o.dbURL, o.schema)
	}
	return b.String()
}

func redact(u string) string { return store.RedactURL(u) }
