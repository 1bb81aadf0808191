package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// outboxctl relay without --fleet, as a service: configured by the environment (as a systemd
// EnvironmentFile or docker --env-file sets it), it relays its outbox, serves /metrics, /healthz
// and /readyz, and on SIGTERM publishes and marks what it holds and exits 0.
func TestRelayOneOutboxAsAServiceUntilSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := tenantDB(t, dir, "shop", 5)
	p := startRelay(t, []string{"OUTBOXKIT_DATABASE_URL=" + url, "OUTBOXKIT_BROKER_URL=memory://",
		"OUTBOXKIT_RELAY=poll", "OUTBOXKIT_RELAY_NAME=orders"}, "relay", "--addr", "127.0.0.1:0")
	cmd, stdout, stderr, exited, base := p.cmd, &p.stdout, &p.stderr, p.exited, p.base
	if !strings.Contains(stdout.String(), "poll relay orders of sqlite") {
		t.Errorf("the banner does not say what relays: %q", stdout.String())
	}
	if !testenv.Within(30*time.Second, func() bool { return pending(t, url) == 0 }) {
		t.Fatalf("%d events still pending\n%s", pending(t, url), stderr.String())
	}
	if code, body := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 200 || !strings.Contains(body, "ready: relay orders") {
		t.Errorf("/readyz: %d %s", code, body)
	}
	if _, metrics := get(t, base+"/metrics"); !strings.Contains(metrics, `outboxkit_forwarder_published_total{forwarder="orders",schema=`) ||
		!strings.Contains(metrics, "outboxkit_outbox_pending") {
		t.Errorf("/metrics lacks the forwarder's series:\n%s", metrics)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		p.waited = true
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not exit within 20s of SIGTERM")
	}
	if !strings.Contains(stdout.String(), "relay orders stopped") {
		t.Errorf("no word of stopping: %q", stdout.String())
	}
}

// A relay of one outbox that could not work is refused at start, saying what to pass.
func TestRelayOneOutboxMistakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := tenantDB(t, dir, "shop", 0)
	notMigrated := "sqlite://" + filepath.Join(dir, "empty.db")
	empty, err := store.Open(context.Background(), notMigrated, store.OpenOptions{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = empty.Close()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--db", "", "relay", "--broker", "memory://"}, 2, "pass --db URL"},
		{[]string{"--db", "shop.db", "relay", "--broker", "memory://"}, 2, "is not a database URL"},
		{[]string{"--db", good, "relay"}, 2, "pass --broker URL"},
		{[]string{"--db", good, "relay", "--broker", "memory://", "--relay", "wal"}, 2, "--relay must be poll"},
		{[]string{"--db", good, "relay", "--broker", "memory://", "--relay", "log"}, 2, "or the binary log of MySQL or MariaDB; sqlite"},
		{[]string{"--db", "mysql://root@127.0.0.1:1/shop", "relay", "--broker", "memory://", "--relay", "log", "--log-mode", "wal"}, 2,
			"--log-mode wal is Postgres's"},
		{[]string{"--db", good, "relay", "--broker", "memory://", "--log-mode", "rows"}, 2, "--log-mode must be table or wal"},
		{[]string{"--db", good, "relay", "--broker", "nowhere://"}, 1, "open the broker"},
		{[]string{"--db", notMigrated, "relay", "--broker", "memory://"}, 1, "outboxctl migrate"},
		{[]string{"--db", "sqlite://" + filepath.Join(dir, "typo.db"), "relay", "--broker", "memory://"}, 1, "must exist"},
	} {
		code, _, stderr := ctl(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}
}

// The log relay as a service: --relay log reads the outbox's inserts from Postgres's write-ahead
// log and publishes them.
func TestRelayOneOutboxByTheLog(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	ctx := context.Background()
	s, err := store.Open(ctx, pg.URL, store.OpenOptions{Schema: string(pg.Schema), PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var out, errOut syncBuffer
	go func() {
		done <- run(rctx, []string{"--db", pg.URL, "--schema", string(pg.Schema), "relay", "--broker", "memory://",
			"--relay", "log", "--name", "orders"}, &out, &errOut)
	}()
	slot := "outboxkit_" + strings.ToLower(string(pg.Schema)) + "_orders"
	defer func() {
		testenv.Eventually(t, 10*time.Second, "the slot dropped", func() bool {
			_, err := pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
			return err == nil
		})
		pg.Exec(t, `DROP PUBLICATION IF EXISTS `+slot)
	}()
	testenv.Eventually(t, 30*time.Second, "the log relay to read its slot", func() bool {
		var active bool
		err := pg.Pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		return err == nil && active
	})
	tx, err := s.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	for i := range 3 {
		if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", fmt.Sprint("order-", i), []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The log relay deletes what it published, at its checkpoint.
	testenv.Eventually(t, 30*time.Second, "the rows relayed and removed", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0
	})
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "log relay orders of postgres") {
		t.Errorf("the banner does not say the log relay runs: %q", out.String())
	}
}

// The binlog relay as a service: --relay log on a mysql:// --db (here from the environment, as an
// env file sets it) reads the outbox's rows from the binary log of MariaDB, publishes them to the
// broker, removes them at its checkpoint — a row of its relay group in binlog_relays — exports
// the group (prom.NewBinlogCollector), which outboxctl status shows read, and on SIGTERM exits 0;
// then status shows the group with no reader.
func TestRelayOneOutboxByTheBinlog(t *testing.T) {
	t.Parallel()
	server, amqpURL := testenv.MySQLBinlogURL(t), testenv.AMQPURL(t)
	name := testenv.UniqueName(t, "ctl")
	admin := testenv.OpenMySQL(t, server)
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS `" + name + "`") })
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	dbURL := u.String()
	if code, _, stderr := ctl(t, "--db", dbURL, "--schema", name, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d, %s", code, stderr)
	}
	topic := name + ".orders"
	q := testenv.BindQueue(t, amqpURL, topic)

	p := startRelay(t, []string{"OUTBOXKIT_DATABASE_URL=" + dbURL, "OUTBOXKIT_SCHEMA=" + name, "OUTBOXKIT_BROKER_URL=" + amqpURL,
		"OUTBOXKIT_RELAY=log", "OUTBOXKIT_RELAY_NAME=orders"}, "relay", "--addr", "127.0.0.1:0")
	if !strings.Contains(p.stdout.String(), "log relay orders of mysql "+name) {
		t.Errorf("the banner does not say the log relay runs on MySQL: %q", p.stdout.String())
	}
	// Ready once it reads the binary log: what commits from now on reaches it from there.
	if !testenv.Within(30*time.Second, func() bool { code, _ := get(t, p.base+"/readyz"); return code == 200 }) {
		t.Fatalf("/readyz never said ready\n%s", p.stderr.String())
	}

	ctx := context.Background()
	s, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: name, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	want := map[string]bool{}
	for i := range 3 {
		ev := pipeline.NewEvent("OrderPlaced", fmt.Sprint("order-", i), []byte(`{}`))
		want[ev.UUID] = true
		if err := pub.Publish(topic, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, d := range q.WaitFor(t, 3, 30*time.Second) {
		if !want[d.UUID] {
			t.Errorf("received message %s, which was not written", d.UUID)
		}
		delete(want, d.UUID)
	}
	if len(want) > 0 {
		t.Errorf("never received %v", want)
	}
	// The binlog relay removes what it published, at its checkpoint, which it records beside.
	count := func(query string) int {
		var n int
		if err := s.SQL.QueryRowContext(ctx, query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, "the rows relayed and removed", func() bool {
		return count("SELECT COUNT(*) FROM `"+name+"`.outbox") == 0
	})
	if n := count("SELECT COUNT(*) FROM `" + name + "`.binlog_relays WHERE name = 'orders'"); n != 1 {
		t.Errorf("%d checkpoints of relay group orders in binlog_relays, want 1", n)
	}
	if _, metrics := get(t, p.base+"/metrics"); !strings.Contains(metrics, `outboxkit_binlog_relay_active{relay="orders",schema="`+name+`"} 1`) ||
		!strings.Contains(metrics, `outboxkit_binlog_relay_lag_bytes{relay="orders",schema="`+name+`"}`) {
		t.Errorf("/metrics lacks the binlog relay group's series:\n%s", metrics)
	}
	if line := binlogLine(t, dbURL, name); !strings.Contains(line, " gtid ") || !strings.Contains(line, " reading ") {
		t.Errorf("status does not show relay group orders read by GTID: %q", line)
	}
	code, stdout, stderr := ctl(t, "--db", dbURL, "--schema", name, "status", "--json")
	var st Status
	if err := json.Unmarshal([]byte(stdout), &st); code != 0 || err != nil {
		t.Fatalf("status --json: exit %d, %v: %s%s", code, err, stdout, stderr)
	}
	if len(st.BinlogRelays) != 1 || st.BinlogRelays[0].Relay != "orders" || !st.BinlogRelays[0].Active || st.BinlogRelays[0].LagBytes == nil ||
		st.BinlogRelays[0].Position == "" || st.BinlogRelays[0].CheckpointAt.IsZero() {
		t.Errorf("status --json does not show relay group orders read, its checkpoint and lag: %s", stdout)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.waited = true
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, p.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not exit within 20s of SIGTERM")
	}
	if !strings.Contains(p.stdout.String(), "relay orders stopped") {
		t.Errorf("no word of stopping: %q", p.stdout.String())
	}
	testenv.Eventually(t, 10*time.Second, "status to show relay group orders with no reader once its relay exited", func() bool {
		return strings.Contains(binlogLine(t, dbURL, name), " none ")
	})
}

// binlogLine is the line of outboxctl status about binlog relay group orders.
func binlogLine(t *testing.T, dbURL, schema string) string {
	t.Helper()
	code, stdout, stderr := ctl(t, "--db", dbURL, "--schema", schema, "status")
	if code != 0 {
		t.Fatalf("status: exit %d, %s", code, stderr)
	}
	if !strings.Contains(stdout, "BINLOG RELAY") {
		t.Fatalf("status lists no binlog relay:\n%s", stdout)
	}
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "orders ") {
			return l
		}
	}
	t.Fatalf("status lists no binlog relay group orders:\n%s", stdout)
	return ""
}
