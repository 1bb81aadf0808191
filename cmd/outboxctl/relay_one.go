package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/urls"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// oneRelay is `outboxctl relay` without --fleet: the relay of one outbox, --db, by polling or by
// reading the database's log — Postgres's write-ahead log (forwarder/pglog), the binary log of MySQL
// or MariaDB (forwarder/mysqlbinlog) — until SIGTERM or SIGINT.
type oneRelay struct {
	broker, relay, name, logMode, addr string
	txnInterval                        time.Duration
}

// runOne relays the outbox of --db until ctx ends: what a pass holds is published and marked
// first, then it returns nil. A relay another relay of its Kafka relay group fenced returns that
// error (exit 1): its successor carries on, and a supervisor's restart makes it the next one.
func (e *env) runOne(ctx context.Context, o oneRelay) error {
	dialect := urls.Dialect(e.dbURL)
	switch {
	case e.dbURL == "":
		return usagef("relay: pass --db URL (or set OUTBOXKIT_DATABASE_URL): the database of the outbox to relay; " +
			"or --fleet NAME for a member of a relay fleet")
	case !strings.Contains(e.dbURL, "://"):
		return usagef("relay: --db %q is not a database URL: use one of %s", e.dbURL, store.Schemes())
	case o.broker == "":
		return usagef("relay: pass --broker URL (or set OUTBOXKIT_BROKER_URL): the broker the outbox publishes to")
	case o.relay != "poll" && o.relay != "log":
		return usagef("relay: --relay must be poll (any database) or log (the database's log: Postgres's write-ahead log, "+
			"the binary log of MySQL or MariaDB), got %q", o.relay)
	case o.relay == "log" && dialect == "":
		return usagef("relay: --relay log reads Postgres's write-ahead log or the binary log of MySQL or MariaDB; %s is neither: use --relay poll",
			store.RedactURL(e.dbURL))
	case o.logMode != string(pglog.ModeTable) && o.logMode != string(pglog.ModeWAL):
		return usagef("relay: --log-mode must be table or wal, got %q", o.logMode)
	case o.relay == "log" && dialect == "mysql" && o.logMode != string(pglog.ModeTable):
		return usagef("relay: --log-mode %s is Postgres's (writers emit logical messages); the binlog relay reads outbox rows "+
			"from the binary log of MySQL or MariaDB: use --log-mode table", o.logMode)
	case o.txnInterval < 0:
		return usagef("relay: --transaction-interval must be 0 or positive, got %s", o.txnInterval)
	}

	var (
		st      store.Store
		pool    *pgxpool.Pool
		closers []func() error
	)
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}()
	if o.relay == "log" && dialect == "postgres" {
		var err error
		if pool, err = pgxpool.New(ctx, e.dbURL); err != nil {
			return fmt.Errorf("database URL %s: %w", store.RedactURL(e.dbURL), err)
		}
		closers = append(closers, func() error { pool.Close(); return nil })
		// The log relay reads the log: it needs no LISTEN connection.
		if st, err = pgxstore.New(pool, pgxstore.Config{Schema: e.schema, PollOnly: true}); err != nil {
			return err
		}
	} else {
		db, err := store.Open(ctx, e.dbURL, store.OpenOptions{Schema: e.schema,
			MustExist: strings.HasPrefix(strings.ToLower(e.dbURL), "sqlite://")})
		if err != nil {
			return err
		}
		closers = append(closers, db.Close)
		st = db
	}

	b, err := backends.Open(ctx, o.broker, backends.Options{})
	if err != nil {
		return fmt.Errorf("open the broker at %s: %w", store.RedactURL(o.broker), err)
	}
	closers = append(closers, b.Close)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: b.Publisher, Name: o.name,
		Metrics: prom.NewForwarderMetrics(reg), TransactionInterval: o.txnInterval})
	if err != nil {
		return &usageError{err.Error()}
	}
	run, started := f.Run, f.Running()
	switch {
	case o.relay == "log" && dialect == "mysql":
		// The binlog relay reads the binary log through its own connections to --db.
		lr, err := mysqlbinlog.New(mysqlbinlog.Config{Forwarder: f, URL: e.dbURL})
		if err != nil {
			return &usageError{err.Error()}
		}
		reg.MustRegister(prom.NewBinlogCollector(lr))
		run, started = lr.Run, lr.Reading()
	case o.relay == "log":
		lr, err := pglog.New(pglog.Config{Forwarder: f, Pool: pool, Mode: pglog.Mode(o.logMode)})
		if err != nil {
			return &usageError{err.Error()}
		}
		reg.MustRegister(prom.NewSlotCollector(lr))
		run, started = lr.Run, lr.Reading()
	}

	stopServing := func() error { return nil }
	served := ""
	if o.addr != "" {
		if stopServing, served, err = serveRelay(o.addr, f, started, reg); err != nil {
			return err
		}
	}
	_, txn := b.Publisher.(forwarder.TransactionalPublisher)
	how := map[bool]string{false: "", true: ", in Kafka transactions"}[txn]
	fmt.Fprintf(e.stdout, "outboxctl relay: %s relay %s of %s %s to %s%s%s\n", o.relay, o.name, st.Info().Name, st.Info().Schema,
		b.Scheme, how, served)
	err = run(ctx)
	if serr := stopServing(); err == nil {
		err = serr
	}
	switch {
	case err == nil:
		fmt.Fprintf(e.stdout, "outboxctl relay: relay %s stopped, what it held published and marked\n", o.name)
	case outboxkit.IsFenced(err):
		return fmt.Errorf("another relay of this relay group took over, and this one stopped: %w", err)
	}
	return err
}

// serveRelay serves the relay's /metrics, /healthz (the process runs) and /readyz (it relays:
// started — listening for writers, reading its slot or the binary log — and the broker neither
// unreachable nor refusing it) on addr, until stop is called.
func serveRelay(addr string, f *forwarder.Forwarder, started <-chan struct{}, reg *prometheus.Registry) (stop func() error, banner string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", usagef("relay: --addr %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-started:
		default:
			http.Error(w, "the relay has not started yet", http.StatusServiceUnavailable)
			return
		}
		h := f.Health()
		if h.Blocked != nil {
			http.Error(w, "the relay cannot publish: "+h.Blocked.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ready: relay %s, last pass %s\n", f.Config().Name, h.LastPass.UTC().Format(time.RFC3339))
	})
	return serve(ln, mux), fmt.Sprintf(", /metrics /healthz /readyz on http://%s", ln.Addr()), nil
}
