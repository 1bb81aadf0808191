package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/internal/tcpproxy"
	"github.com/outboxkit/outboxkit/internal/topics"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every database URL
)

// env is what one soak runs against: its own names on the shared servers, and the means to
// provoke each fault on them without touching anyone else's.
type env struct {
	o    options
	run  string // the soak's name: schema, vhost, MySQL user, Postgres application_name prefix
	dir  string
	demo string // the demo binary

	brokerURL string          // what the processes dial
	proxy     *tcpproxy.Proxy // in front of the broker, where its connections are cut by proxy
	kfake     *exec.Cmd

	mysqlUser string
	cleanups  []func()
}

func newName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "chaos_" + hex.EncodeToString(b)
}

// setUp creates the soak's own names on the servers and builds what it runs.
func setUp(ctx context.Context, o options) (*env, error) {
	e := &env{o: o, run: newName()}
	var err error
	if e.dir = o.work; e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "outboxkit-"+e.run+"-"); err != nil {
			return nil, err
		}
		if !o.keep {
			e.cleanups = append(e.cleanups, func() { _ = os.RemoveAll(e.dir) })
		}
	} else if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	if e.demo = o.demoBin; e.demo == "" {
		e.demo = filepath.Join(e.dir, "demo")
		if err := build(ctx, o.repo, e.demo, "./cmd/demo"); err != nil {
			return nil, err
		}
	}
	if o.relay == "log" && o.store == "postgres" {
		e.cleanups = append(e.cleanups, e.dropSlots) // runs after the schema's drop: cleanups run last first
	}
	if err := e.setUpStore(ctx); err != nil {
		e.tearDown()
		return nil, err
	}
	if err := e.setUpBroker(ctx); err != nil {
		e.tearDown()
		return nil, err
	}
	return e, nil
}

func build(ctx context.Context, dir, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s (pass --repo or --demo): %v\n%s", pkg, dir, err, b)
	}
	return nil
}

// tearDown removes what setUp created, unless --keep.
func (e *env) tearDown() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
	e.cleanups = nil
}

func (e *env) setUpStore(ctx context.Context) error {
	switch e.o.store {
	case "postgres":
		if !e.o.keep {
			e.cleanups = append(e.cleanups, func() {
				_ = e.rootExec(`DROP SCHEMA IF EXISTS "` + e.run + `" CASCADE`)
				_ = e.rootExec(`DROP SCHEMA IF EXISTS "` + e.run + `_gateway" CASCADE`)
			})
		}
		return nil
	case "mysql":
		// A user of the soak's own: its sessions are the ones KILLed, nobody else's.
		e.mysqlUser = e.run
		stmts := []string{
			"CREATE DATABASE `" + e.run + "`", "CREATE DATABASE `" + e.run + "_gateway`",
			"CREATE USER '" + e.run + "'@'%'", "CREATE USER '" + e.run + "'@'localhost'",
			"GRANT ALL PRIVILEGES ON `" + e.run + "`.* TO '" + e.run + "'@'%', '" + e.run + "'@'localhost'",
			"GRANT ALL PRIVILEGES ON `" + e.run + "_gateway`.* TO '" + e.run + "'@'%', '" + e.run + "'@'localhost'",
		}
		if e.o.relay == "log" {
			// The binlog relay reads the binary log as a replica does. (REPLICATION CLIENT is
			// MariaDB's older name of BINLOG MONITOR, and MySQL's own.)
			stmts = append(stmts, "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+e.run+"'@'%', '"+e.run+"'@'localhost'")
		}
		if !e.o.keep {
			e.cleanups = append(e.cleanups, func() {
				_ = e.rootExec("DROP DATABASE IF EXISTS `" + e.run + "`")
				_ = e.rootExec("DROP DATABASE IF EXISTS `" + e.run + "_gateway`")
				_ = e.rootExec("DROP USER IF EXISTS '" + e.run + "'@'%', '" + e.run + "'@'localhost'")
			})
		}
		for _, s := range stmts {
			if err := e.rootExec(s); err != nil {
				return fmt.Errorf("set up the soak's MySQL database and user: %s: %w", s, err)
			}
		}
	}
	return nil
}

// rootExec runs a statement as the server's administrator (the URL given with --db).
func (e *env) rootExec(stmt string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := e.adminDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.SQL.ExecContext(ctx, stmt)
	return err
}

// adminDB opens the --db URL itself, as the administrator (SQLite: the soak's file).
func (e *env) adminDB(ctx context.Context) (*store.DB, error) {
	if e.o.store == "sqlite" {
		return e.checkerDB(ctx, e.run)
	}
	return store.Open(ctx, e.withAppName(e.o.dbURL, e.run+"_driver"), store.OpenOptions{Schema: e.run, MaxConns: 4})
}

// dbURL is the database URL of one of the soak's processes: on Postgres it carries the
// application_name the session terminations filter on; on MySQL the soak's own user.
func (e *env) dbURL(role string) string {
	switch e.o.store {
	case "postgres":
		return e.withAppName(e.o.dbURL, e.run+"-"+role)
	case "mysql":
		u, _ := url.Parse(e.o.dbURL)
		u.User = url.User(e.mysqlUser)
		u.Path = "/" + e.run // its own database: the user may use no other
		return u.String()
	}
	return "sqlite://" + filepath.Join(e.dir, "chaos.db")
}

func (e *env) withAppName(raw, name string) string {
	if e.o.store != "postgres" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// checkerDB opens the soak's tables for the checker.
func (e *env) checkerDB(ctx context.Context, schema string) (*store.DB, error) {
	switch e.o.store {
	case "sqlite":
		file := filepath.Join(e.dir, "chaos.db")
		if strings.HasSuffix(schema, "_gateway") {
			file += "-gateway"
		}
		return store.Open(ctx, "sqlite://"+file, store.OpenOptions{MaxConns: 2})
	}
	return store.Open(ctx, e.withAppName(e.o.dbURL, e.run+"_driver"), store.OpenOptions{Schema: schema, MaxConns: 4})
}

func (e *env) setUpBroker(ctx context.Context) error {
	topic := e.run + ".orders"
	switch e.o.broker {
	case "amqp":
		// A vhost of the soak's own: its connections are the ones closed, nobody else's.
		u, err := url.Parse(e.o.brokerURL)
		if err != nil {
			return fmt.Errorf("--broker-url: %w", err)
		}
		user := u.User.Username()
		if err := rabbitmqctl(ctx, "add_vhost", e.run); err != nil {
			return err
		}
		if !e.o.keep {
			e.cleanups = append(e.cleanups, func() { _ = rabbitmqctl(context.Background(), "delete_vhost", e.run) })
		}
		if err := rabbitmqctl(ctx, "set_permissions", "-p", e.run, user, ".*", ".*", ".*"); err != nil {
			return err
		}
		u.Path = "/" + e.run
		e.brokerURL = u.String()
	case "nats", "redis":
		u, err := url.Parse(e.o.brokerURL)
		if err != nil {
			return fmt.Errorf("--broker-url: %w", err)
		}
		if e.proxy, err = tcpproxy.Listen(u.Host); err != nil {
			return err
		}
		e.cleanups = append(e.cleanups, e.proxy.Close)
		if !e.o.keep {
			e.cleanups = append(e.cleanups, func() { topics.Remove(e.o.brokerURL, e.o.broker, topic) })
		}
		u.Host = e.proxy.Addr()
		e.brokerURL = u.String()
	case "kafka":
		return e.startKafka(ctx)
	}
	return nil
}

// startKafka starts a kfake broker of the soak's own that tells its clients to dial a proxy in
// front of it (Kafka clients dial the address the broker advertises, so a proxy in front of the
// shared broker would only cut the first connection). Its topics die with it.
func (e *env) startKafka(ctx context.Context) error {
	bin := filepath.Join(e.dir, "kfake")
	if err := build(ctx, filepath.Join(e.o.repo, "tools", "kfake"), bin, "."); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	listen := ln.Addr().String()
	_ = ln.Close()
	if e.proxy, err = tcpproxy.Listen(listen); err != nil {
		return err
	}
	e.cleanups = append(e.cleanups, e.proxy.Close)
	log, err := os.Create(filepath.Join(e.dir, "kfake.log"))
	if err != nil {
		return err
	}
	// Partitions enough for every process of a consumer to have its own.
	e.kfake = exec.Command(bin, "-addr", e.proxy.Addr(), "-listen", listen, "-partitions", strconv.Itoa(max(4, e.o.replicas)))
	e.kfake.Stdout, e.kfake.Stderr = log, log
	if err := e.kfake.Start(); err != nil {
		return err
	}
	e.cleanups = append(e.cleanups, func() { _ = e.kfake.Process.Kill(); _ = e.kfake.Wait(); _ = log.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the soak's kfake did not listen on %s within 30s: see %s", listen, log.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.brokerURL = "kafka://" + e.proxy.Addr()
	return nil
}

// txnBrokerURL is the relays' Kafka URL with --kafka-txn: the run's name is its relay group
// (transactional_id), so no other run's relays fence the soak's, and its progress topic
// (outboxkit.progress.<run>) dies with the soak's broker.
func (e *env) txnBrokerURL() string {
	return e.brokerURL + "?transactional_id=" + e.run
}

func rabbitmqctl(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %v: %s (the amqp soak runs rabbitmqctl on this machine's broker)",
			strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// terminateSessions ends every database session of the soak's processes, and only theirs. It
// returns how many it ended.
func (e *env) terminateSessions(ctx context.Context, db *sql.DB) (int, error) {
	switch e.o.store {
	case "postgres":
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE starts_with(application_name, $1) AND pid <> pg_backend_pid()`, e.run+"-").Scan(&n)
		return n, err
	case "mysql":
		rows, err := db.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE user = ?`, e.mysqlUser)
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		n := 0
		for _, id := range ids {
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
				n++
			}
		}
		return n, nil
	}
	return 0, errors.New("SQLite has no sessions to terminate")
}

// slotPattern matches the replication slots and publications of the soak's log relays
// (outboxkit_<schema>_<group>).
func (e *env) slotPattern() string { return "outboxkit_" + e.run + "_%" }

// waitLogRelay waits until a log relay has started: on Postgres, made its replication slot (in WAL
// mode the writers refuse before that); on MySQL, recorded its relay group's first checkpoint,
// which it does once it has passed its checks and read the rows already in the table — a server
// without the binary log fails here, saying so, rather than in the drain.
func (e *env) waitLogRelay(ctx context.Context, db *sql.DB, within time.Duration) error {
	what := "no replication slot " + e.slotPattern()
	query, arg := `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, e.slotPattern()
	if e.o.store == "mysql" {
		what = "no binlog relay checkpoint in `" + e.run + "`.binlog_relays"
		query, arg = "SELECT count(*) FROM `"+e.run+"`.binlog_relays WHERE name = ?", relayGroup
	}
	deadline := time.Now().Add(within)
	for {
		var n int
		err := db.QueryRowContext(ctx, query, arg).Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s within %s (last error: %v)", what, within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// dropSlots drops the soak's replication slots and publications once its relays are gone, even
// with --keep: a slot nobody reads keeps the server's WAL.
func (e *env) dropSlots() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := e.adminDB(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: drop the log relay's slot %s by hand: %v\n", e.slotPattern(), err)
		return
	}
	defer db.Close()
	for {
		// A killed relay's walsender may hold its slot a moment longer.
		_, err := db.SQL.ExecContext(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name LIKE $1 AND NOT active`, e.slotPattern())
		var left int
		if err == nil {
			err = db.SQL.QueryRowContext(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, e.slotPattern()).Scan(&left)
		}
		if err == nil && left == 0 {
			break
		}
		if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "chaos: drop the log relay's slot %s by hand (SELECT pg_drop_replication_slot(…)): %v, %d left\n",
				e.slotPattern(), err, left)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	rows, err := db.SQL.QueryContext(ctx, `SELECT pubname FROM pg_publication WHERE pubname LIKE $1`, e.slotPattern())
	if err != nil {
		return
	}
	var pubs []string
	for rows.Next() {
		var p string
		if rows.Scan(&p) == nil {
			pubs = append(pubs, p)
		}
	}
	rows.Close()
	for _, p := range pubs {
		_, _ = db.SQL.ExecContext(ctx, `DROP PUBLICATION IF EXISTS "`+p+`"`)
	}
}
