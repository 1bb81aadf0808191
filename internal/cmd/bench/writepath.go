package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// writeMode is what one business transaction does.
type writeMode struct {
	key     string // its name in --write-modes
	name    string
	minimal bool // a second, minimal row: the physical price of one more small INSERT
	outbox  bool // the event's outbox row
	notify  bool // and the NOTIFY that wakes the relay (skipped while a relay says it is awake)
	// withCommit sends the outbox row in the COMMIT's round trip (pgxstore.Transact) instead of
	// its own (Publish, then Commit).
	withCommit bool
	// wal writes the event as a logical decoding message instead of a row (pgxstore.Config.WAL;
	// the target makes a log relay's slot in WAL mode first).
	wal bool
	// relayPoll, when set, runs a relay draining the outbox (to a publisher that discards) during
	// the measurement; with notify, its poll under the wake-ups.
	relayPoll time.Duration
}

const (
	modeAlone   = "business tx alone"
	modeMinimal = "+ minimal row"
	modeOutbox  = "+ outbox row"
	modeCommit  = "+ outbox row sent with COMMIT"
	modeNotify  = "+ outbox row + NOTIFY"
	modeRelay   = "+ outbox row, relay polling every 20ms"
	modeAwake   = "+ outbox row + NOTIFY, relay running"
)

var pgWriteModes = []writeMode{
	{key: "alone", name: modeAlone},
	{key: "minimal", name: modeMinimal, minimal: true},
	{key: "outbox", name: modeOutbox, outbox: true},
	{key: "commit", name: modeCommit, outbox: true, withCommit: true},
	{key: "notify", name: modeNotify, outbox: true, notify: true},
	{key: "relay", name: modeRelay, outbox: true, relayPoll: 20 * time.Millisecond},
	{key: "awake", name: modeAwake, outbox: true, notify: true, relayPoll: forwarder.DefaultPollInterval},
}

// On MySQL and SQLite the writer wakes nobody through the database (MySQL has no NOTIFY; SQLite
// wakes relays of the same handle in process), so the outbox row is the whole price.
var sqlWriteModes = []writeMode{{key: "alone", name: modeAlone}, {key: "minimal", name: modeMinimal, minimal: true},
	{key: "outbox", name: modeOutbox, outbox: true}}

// writeTarget is a store the write path is measured on.
type writeTarget struct {
	desc  string
	modes []writeMode
	// load runs n clients committing transactions of mode m back to back for d; it returns every
	// transaction's latency and the time it took.
	load  func(ctx context.Context, m writeMode, n int, d time.Duration) ([]time.Duration, time.Duration, error)
	close func()
}

// benchWritePath times the business transaction (insert an order, commit) alone, with a minimal
// second row (the physical reference: a bigserial key, a topic and a JSON payload) and with its
// outbox row, at 1, 4 and 16 concurrent clients, for c.writeFor each, on the store --store names.
// Modes alternate within a round, so each ratio pairs figures measured back to back.
func benchWritePath(ctx context.Context, c config) ([]series, error) {
	if c.writeAsync && c.store != "postgres" {
		return nil, fmt.Errorf("--write-async applies to --store postgres only (synchronous_commit); %s flushes as it is configured", c.store)
	}
	var (
		target *writeTarget
		err    error
	)
	switch c.store {
	case "postgres":
		target, err = pgWriteTarget(ctx, c, c.dbURL, pgWriteModes)
	case "mysql":
		target, err = sqlWriteTarget(ctx, c.mysqlURL, "MySQL/MariaDB")
	case "sqlite":
		dir, derr := os.MkdirTemp("", "outboxkit-bench-")
		if derr != nil {
			return nil, derr
		}
		defer os.RemoveAll(dir)
		target, err = sqlWriteTarget(ctx, "sqlite://"+filepath.Join(dir, "write.db"), "SQLite")
	default:
		err = fmt.Errorf("--store %q: use postgres, mysql or sqlite", c.store)
	}
	if err != nil {
		return nil, err
	}
	defer target.close()
	flush := ""
	if c.writeAsync {
		flush = " (synchronous_commit off)"
	}
	fmt.Printf("\nwrite path on %s%s: INSERT an order and COMMIT, alone, with a minimal second row and with its outbox row; %s per measurement, %d reps\n",
		target.desc, flush, c.writeFor, c.reps)

	clients := []int{1, 4, 16}
	modes, err := pickWriteModes(target.modes, c.writeModes)
	if err != nil {
		return nil, err
	}
	profile, err := openProfile(c.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer profile.close()
	// --cpuprofile: the writers' side of the outbox row at 16 clients, first round.
	fig, err := measureWrites(ctx, c, target, modes, clients, profile, modeOutbox)
	if err != nil {
		return nil, err
	}
	type key = writeKey
	p50, p99, tps, mean := fig.p50, fig.p99, fig.tps, fig.mean
	idx := func(name string) int {
		return slices.IndexFunc(modes, func(m writeMode) bool { return m.name == name })
	}
	var lat, thr, over, rowCost, rowCostOfMedians []series
	for _, n := range clients {
		for mi := range modes {
			k := key{mi, n}
			lat = append(lat, *p50[k], *p99[k])
			thr = append(thr, *tps[k])
		}
		base := key{0, n}
		for mi := 1; mi < len(modes); mi++ {
			k := key{mi, n}
			over = append(over, overhead(fmt.Sprintf("%s, %d clients: p50 cost", modes[mi].name, n), *p50[k], *p50[base]))
		}
		// The outbox row's price over the minimal row's, each the extra time per transaction over
		// the business transaction alone in the same round.
		alone, minimal := mean[key{0, n}], mean[key{idx(modeMinimal), n}]
		for _, name := range []string{modeOutbox, modeCommit} {
			if idx(name) < 0 {
				continue
			}
			outbox := mean[key{idx(name), n}]
			label := strings.TrimPrefix(name, "+ ")
			r := series{Name: fmt.Sprintf("%s ÷ minimal row, %d clients", label, n), Unit: "×"}
			for i := range alone.Values {
				if d := minimal.Values[i] - alone.Values[i]; d > 0 {
					r.add((outbox.Values[i] - alone.Values[i]) / d)
				}
			}
			rowCost = append(rowCost, r)
			// The same from the medians of the three, less exposed to one noisy round's small
			// denominator.
			if d := minimal.median() - alone.median(); d > 0 {
				rowCostOfMedians = append(rowCostOfMedians, series{Name: fmt.Sprintf("%s ÷ minimal row, %d clients, of medians", label, n),
					Unit: "×", Values: []float64{(outbox.median() - alone.median()) / d}})
			}
		}
	}
	fmt.Print(table("write path latency", lat))
	fmt.Print(table("write path throughput", thr))
	fmt.Print(table("cost on the business tx, paired by round", over))
	fmt.Print(table("what the outbox row costs, in minimal rows (time per tx over the business tx alone), paired by round", rowCost))
	fmt.Print(table("the same, from each mode's median time per tx", rowCostOfMedians))
	out := slices.Concat(lat, thr, over, rowCost, rowCostOfMedians)
	if relay, awake := idx(modeRelay), idx(modeAwake); relay >= 0 && awake >= 0 {
		// The price of waking the relay, with a relay draining in both: NOTIFY (skipped while the
		// relay says it is awake) against no NOTIFY and a 20ms poll.
		var notifyCost []series
		for _, n := range clients {
			notifyCost = append(notifyCost, ratio(fmt.Sprintf("NOTIFY / no NOTIFY, relay running, %d clients, tx/s", n),
				*tps[key{awake, n}], *tps[key{relay, n}]))
		}
		fmt.Print(table("waking the relay, paired by round", notifyCost))
		out = append(out, notifyCost...)
	}
	return out, nil
}

// writeKey is one write-path measurement: a mode (its index) at a number of clients.
type writeKey struct{ mode, clients int }

// writeFigures are a write-path run's series by measurement: p50 and p99 latency, throughput, and
// the mean time a client spends per transaction.
type writeFigures struct{ p50, p99, tps, mean map[writeKey]*series }

// measureWrites runs c.reps rounds of target's load, for c.writeFor each: in each round, for each
// number of clients, the modes alternate, so each ratio pairs figures measured back to back.
// profile, when set, receives a CPU profile of the first round's mode named profiled at 16 clients.
func measureWrites(ctx context.Context, c config, target *writeTarget, modes []writeMode, clients []int,
	profile *cpuProfile, profiled string) (writeFigures, error) {
	fig := writeFigures{p50: map[writeKey]*series{}, p99: map[writeKey]*series{}, tps: map[writeKey]*series{}, mean: map[writeKey]*series{}}
	for mi, m := range modes {
		for _, n := range clients {
			k := writeKey{mi, n}
			fig.p50[k] = &series{Name: fmt.Sprintf("%s, %d clients, p50", m.name, n), Unit: "ms"}
			fig.p99[k] = &series{Name: fmt.Sprintf("%s, %d clients, p99", m.name, n), Unit: "ms"}
			fig.tps[k] = &series{Name: fmt.Sprintf("%s, %d clients", m.name, n), Unit: "tx/s"}
			fig.mean[k] = &series{Name: fmt.Sprintf("%s, %d clients, mean", m.name, n), Unit: "ms"}
		}
	}
	for rep := 1; rep <= c.reps; rep++ {
		for _, n := range clients {
			for mi, m := range modes {
				var (
					lat     []time.Duration
					elapsed time.Duration
				)
				err := profile.during(rep == 1 && n == 16 && m.name == profiled, func() (err error) {
					lat, elapsed, err = target.load(ctx, m, n, c.writeFor)
					return err
				})
				if err != nil {
					return fig, fmt.Errorf("%s: %w", m.name, err)
				}
				k := writeKey{mi, n}
				fig.p50[k].add(ms(percentile(lat, 50)))
				fig.p99[k].add(ms(percentile(lat, 99)))
				fig.tps[k].add(rate(len(lat), elapsed))
				// The time a client spends per transaction, from the throughput: at 16 clients on
				// two cores it is the cost that queues, which p50 alone hides.
				fig.mean[k].add(float64(n) * ms(elapsed) / float64(max(len(lat), 1)))
			}
		}
		fmt.Printf("  round %d done\n", rep)
	}
	return fig, nil
}

// pickWriteModes keeps the modes list names (comma-separated keys; every mode when it is empty),
// in their usual order. The business transaction alone and the minimal row are always kept: every
// ratio is taken over them.
func pickWriteModes(all []writeMode, list string) ([]writeMode, error) {
	if strings.TrimSpace(list) == "" {
		return all, nil
	}
	want := map[string]bool{"alone": true, "minimal": true}
	for _, k := range strings.Split(list, ",") {
		k = strings.TrimSpace(k)
		if !slices.ContainsFunc(all, func(m writeMode) bool { return m.key == k }) {
			keys := make([]string, len(all))
			for i, m := range all {
				keys[i] = fmt.Sprintf("%s (%s)", m.key, m.name)
			}
			return nil, fmt.Errorf("--write-modes: no mode %q here; the modes are %s", k, strings.Join(keys, ", "))
		}
		want[k] = true
	}
	var out []writeMode
	for _, m := range all {
		if want[m.key] {
			out = append(out, m)
		}
	}
	return out, nil
}

// The minimal row: what one more small INSERT costs on this machine (as pgbench would measure it).
const minimalRowDDL = `CREATE TABLE %s (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, payload jsonb NOT NULL)`

// pgWriteTarget measures modes on the Postgres dbURL names.
func pgWriteTarget(ctx context.Context, c config, dbURL string, modes []writeMode) (*writeTarget, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	if c.writeAsync {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	schema, drop, err := newSchema(ctx, pool, "bench_write")
	if err != nil {
		pool.Close()
		return nil, err
	}
	closeAll := func() { drop(); pool.Close() }
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		closeAll()
		return nil, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(minimalRowDDL, schema+".events_min")); err != nil {
		closeAll()
		return nil, err
	}
	if slices.ContainsFunc(modes, func(m writeMode) bool { return m.wal }) {
		// Writers in WAL mode write once a log relay in WAL mode has made its slot: make it, and
		// leave it unread (the writers' cost alone).
		fwd, err := forwarder.New(forwarder.Config{Store: storeIn(pool, schema, pgxstore.Config{PollOnly: true}), Publisher: discard{}, Name: "write"})
		if err != nil {
			closeAll()
			return nil, err
		}
		relay, dropSlot, err := newLogRelay(pool, fwd, "wal")
		if err != nil {
			closeAll()
			return nil, err
		}
		closeAll = func() { dropSlot(); drop(); pool.Close() }
		if err := runFor(ctx, relay, 0); err != nil {
			closeAll()
			return nil, err
		}
	}
	insert := `INSERT INTO ` + schema + `.orders (customer, total_cents) VALUES ($1, $2) RETURNING id`
	insertMin := `INSERT INTO ` + schema + `.events_min (topic, payload) VALUES ('orders', $1)`
	load := func(ctx context.Context, m writeMode, n int, d time.Duration) ([]time.Duration, time.Duration, error) {
		outbox := storeIn(pool, schema, pgxstore.Config{DisableNotify: !m.notify, WAL: m.wal})
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
		return clientsFor(n, d, func(w, i int) error {
			if m.withCommit {
				return outbox.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
					var id int64
					if err := tx.QueryRow(ctx, insert, fmt.Sprintf("customer-%d", w), i).Scan(&id); err != nil {
						return err
					}
					body, key := payload(int(id), 200)
					return pub.Publish("orders", pipeline.NewEvent("OrderPlaced", key, body))
				})
			}
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var id int64
				if err := tx.QueryRow(ctx, insert, fmt.Sprintf("customer-%d", w), i).Scan(&id); err != nil {
					return err
				}
				body, key := payload(int(id), 200)
				switch {
				case m.minimal:
					_, err := tx.Exec(ctx, insertMin, string(body))
					return err
				case m.outbox:
					pub, err := pipeline.NewPublisher(outbox, tx, pipeline.PublisherConfig{})
					if err != nil {
						return err
					}
					return pub.Publish("orders", pipeline.NewEvent("OrderPlaced", key, body))
				}
				return nil
			})
		})
	}
	return &writeTarget{desc: "Postgres (pgx)", modes: modes, load: load, close: closeAll}, nil
}

// sqlWriteTarget measures a database/sql store (MySQL/MariaDB, SQLite) opened by URL.
func sqlWriteTarget(ctx context.Context, dbURL, desc string) (*writeTarget, error) {
	schema := fmt.Sprintf("bench_write_%d", time.Now().UnixNano()%1e9)
	db, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: schema})
	if err != nil {
		return nil, err
	}
	closeAll := func() {
		if db.Dialect == "mysql" {
			_, _ = db.SQL.Exec("DROP DATABASE `" + schema + "`")
		}
		db.Close()
	}
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		closeAll()
		return nil, err
	}
	// The business tables live beside outboxkit's: in the run's own database on MySQL (dropped at
	// the end), in the run's file on SQLite.
	in := ""
	if db.Dialect == "mysql" {
		in = "`" + schema + "`."
	}
	ddl := []string{
		`CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL,
			created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`,
		`CREATE TABLE events_min (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload TEXT NOT NULL)`,
	}
	if db.Dialect == "mysql" {
		ddl = []string{
			`CREATE TABLE ` + in + `orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL, total_cents BIGINT NOT NULL,
				created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`,
			`CREATE TABLE ` + in + `events_min (id BIGINT AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(255) NOT NULL, payload JSON NOT NULL)`,
		}
	}
	for _, q := range ddl {
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			closeAll()
			return nil, err
		}
	}
	insert := db.Rebind(`INSERT INTO ` + in + `orders (customer, total_cents) VALUES (?, ?)`)
	insertMin := db.Rebind(`INSERT INTO ` + in + `events_min (topic, payload) VALUES ('orders', ?)`)
	load := func(ctx context.Context, m writeMode, n int, d time.Duration) ([]time.Duration, time.Duration, error) {
		return clientsFor(n, d, func(w, i int) error {
			tx, err := db.SQL.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			res, err := tx.ExecContext(ctx, insert, fmt.Sprintf("customer-%d", w), i)
			if err != nil {
				return err
			}
			id, err := res.LastInsertId()
			if err != nil {
				return err
			}
			body, key := payload(int(id), 200)
			switch {
			case m.minimal:
				if _, err := tx.ExecContext(ctx, insertMin, string(body)); err != nil {
					return err
				}
			case m.outbox:
				pub, err := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
				if err != nil {
					return err
				}
				if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", key, body)); err != nil {
					return err
				}
			}
			return tx.Commit()
		})
	}
	return &writeTarget{desc: desc, modes: sqlWriteModes, load: load, close: closeAll}, nil
}

// clientsFor runs n clients, each running tx(client, i) back to back for d; it returns every
// transaction's latency.
func clientsFor(n int, d time.Duration, tx func(client, i int) error) ([]time.Duration, time.Duration, error) {
	var (
		mu   sync.Mutex
		all  []time.Duration
		errs = make(chan error, n)
		wg   sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; time.Now().Before(deadline); i++ {
				t0 := time.Now()
				if err := tx(w, i); err != nil {
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
