package mysqlbinlog_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverURL is the binlog server's URL (testenv.EnvMySQLBinlog: scripts/mariadb-binlog.sh starts
// a private one), or the test is skipped naming the variable — failed instead under CI=true.
func serverURL(t testing.TB) string { return testenv.MySQLBinlogURL(t) }

// outbox is a migrated outbox in a database of its own on the binlog server, dropped when the
// test ends.
type outbox struct {
	url      string // the server, with the outbox's database as the connection's
	database string
	db       *sql.DB
	store    *mysqlstore.Store
}

func newOutbox(t *testing.T) *outbox {
	t.Helper()
	o := newDatabase(t)
	if _, err := o.store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", o.database, err)
	}
	return o
}

// newDatabase is an empty database of its own, with a store on it, not migrated.
func newDatabase(t *testing.T) *outbox {
	t.Helper()
	server := serverURL(t)
	name := testenv.UniqueName(t, "b")
	admin := testenv.OpenMySQL(t, server)
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	o := &outbox{url: u.String(), database: name, db: testenv.OpenMySQL(t, u.String())}
	if o.store, err = mysqlstore.New(o.db, mysqlstore.Config{Schema: name}); err != nil {
		t.Fatal(err)
	}
	return o
}

func (o *outbox) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := o.db.QueryRow("SELECT COUNT(*) FROM outbox WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ids lists the outbox's rows' ids.
func (o *outbox) ids(t *testing.T) []string {
	t.Helper()
	rows, err := o.db.Query("SELECT uuid FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// write commits n rows of key in one transaction and returns their ids; their payloads are
// key:0 … key:n-1.
func (o *outbox) write(t *testing.T, key string, n int) []string {
	t.Helper()
	return o.writeFrom(t, key, 0, n)
}

// writeFrom is write with payloads key:from … key:from+n-1.
func (o *outbox) writeFrom(t *testing.T, key string, from, n int) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	ids := o.insert(t, tx, key, from, n)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (o *outbox) insert(t *testing.T, tx *sql.Tx, key string, from, n int) []string {
	t.Helper()
	return o.insertTo(t, tx, "orders", key, from, n)
}

// writeTo is write to topic.
func (o *outbox) writeTo(t *testing.T, topic, key string, n int) []string {
	t.Helper()
	tx, err := o.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	ids := o.insertTo(t, tx, topic, key, 0, n)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (o *outbox) insertTo(t *testing.T, tx *sql.Tx, topic, key string, from, n int) []string {
	t.Helper()
	ids := make([]string, n)
	msgs := make([]store.OutboxMessage, n)
	for i := range msgs {
		ids[i] = uuid.Must(uuid.NewV7()).String()
		msgs[i] = store.OutboxMessage{UUID: ids[i], Topic: topic, PartitionKey: key,
			Payload: []byte(key + ":" + strconv.Itoa(from+i)), Metadata: []byte("{}")}
	}
	if err := o.store.UnwrapTx(tx).InsertOutbox(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	return ids
}

// recorder is a broker that keeps what it received, in order, as an inbox sees it. fail, when
// set, refuses the messages it returns true for.
type recorder struct {
	mu    sync.Mutex
	seen  map[string]int // message id → deliveries
	order []*message.Message
	fail  func(m *message.Message) bool
}

func newRecorder() *recorder { return &recorder{seen: map[string]int{}} }

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if r.fail != nil && r.fail(m) {
			return fmt.Errorf("the broker refuses message %s", m.UUID)
		}
		r.seen[m.UUID]++
		r.order = append(r.order, m)
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) has(ids []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.seen[id] == 0 {
			return false
		}
	}
	return true
}

func (r *recorder) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// duplicated lists the ids received more than once.
func (r *recorder) duplicated() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for id, n := range r.seen {
		if n > 1 {
			out[id] = n
		}
	}
	return out
}

// index is the position of id's first delivery, -1 if none.
func (r *recorder) index(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.order {
		if m.UUID == id {
			return i
		}
	}
	return -1
}

func (r *recorder) received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order)
}

// payloads are the payloads received, in order.
func (r *recorder) payloads() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.order))
	for i, m := range r.order {
		out[i] = string(m.Payload)
	}
	return out
}

// relayOn builds a binlog relay on o publishing to pub.
func relayOn(t *testing.T, o *outbox, pub message.Publisher, tune func(*forwarder.Config, *mysqlbinlog.Config)) *mysqlbinlog.Relay {
	t.Helper()
	fcfg := forwarder.Config{Store: o.store, Publisher: pub, Backoff: forwarder.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 2},
		CircuitBackoff: forwarder.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2}}
	cfg := mysqlbinlog.Config{URL: o.url, FlushInterval: 50 * time.Millisecond}
	if tune != nil {
		tune(&fcfg, &cfg)
	}
	f, err := forwarder.New(fcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Forwarder = f
	r, err := mysqlbinlog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run starts r, waits until it reads the binary log and returns a stop that cancels it and
// waits for Run's return.
func run(t *testing.T, r *mysqlbinlog.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Reading():
	case err := <-done:
		cancel()
		t.Fatalf("relay ended before reading the binary log: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("relay did not start reading the binary log within 30s")
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// runErr runs r until it returns by itself, within 30s, and returns its error.
func runErr(t *testing.T, r *mysqlbinlog.Relay) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("relay ran until its deadline instead of refusing to start (returned %v)", err)
	}
	return err
}

// N writers commit and roll back rows over many keys, each key's writers serialized by its
// aggregate's row: every committed row arrives once, in commit order within its key, no
// rolled-back row ever does, the published rows leave the table, and the checkpoints that remove
// them are few.
func TestCommittedRowsArriveOnceInCommitOrderPerKey(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	if _, err := o.db.Exec(`CREATE TABLE aggregates (id VARCHAR(16) PRIMARY KEY, version INT NOT NULL) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	const keys, writers, txns = 20, 6, 40
	for k := range keys {
		if _, err := o.db.Exec(`INSERT INTO aggregates VALUES (?, 0)`, fmt.Sprintf("k%02d", k)); err != nil {
			t.Fatal(err)
		}
	}
	pub := newRecorder()
	r := relayOn(t, o, pub, func(f *forwarder.Config, _ *mysqlbinlog.Config) { f.BatchSize = 64; f.MaxInFlight = 8 })
	stop := run(t, r)

	var (
		mu         sync.Mutex
		committed  []string
		rolledBack []string
		wg         sync.WaitGroup
	)
	ctx := context.Background()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range txns {
				key := fmt.Sprintf("k%02d", (w*txns+i)%keys)
				tx, err := o.db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					return
				}
				var v int
				if err := tx.QueryRow(`SELECT version FROM aggregates WHERE id = ? FOR UPDATE`, key).Scan(&v); err != nil {
					_ = tx.Rollback()
					t.Error(err)
					return
				}
				n := 1 + i%3
				ids := o.insert(t, tx, key, v, n)
				if _, err := tx.Exec(`UPDATE aggregates SET version = ? WHERE id = ?`, v+n, key); err != nil {
					_ = tx.Rollback()
					t.Error(err)
					return
				}
				if i%5 == 4 {
					if err := tx.Rollback(); err != nil {
						t.Error(err)
					}
					mu.Lock()
					rolledBack = append(rolledBack, ids...)
					mu.Unlock()
					continue
				}
				if err := tx.Commit(); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				committed = append(committed, ids...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	testenv.Eventually(t, 30*time.Second, "every committed row to arrive", func() bool { return pub.has(committed) })
	testenv.Eventually(t, 10*time.Second, "the published rows to leave the outbox", func() bool { return o.count(t, "1") == 0 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, id := range rolledBack {
		if n := pub.count(id); n != 0 {
			t.Errorf("rolled-back row %s arrived %d times", id, n)
		}
	}
	if d := pub.duplicated(); len(d) > 0 {
		t.Errorf("%d rows arrived more than once with no restart: %v", len(d), d)
	}
	if got := pub.received(); got != len(committed) {
		t.Errorf("received %d messages, want the %d committed", got, len(committed))
	}
	next := map[string]int{}
	for _, p := range pub.payloads() {
		key, v, _ := strings.Cut(p, ":")
		n, _ := strconv.Atoi(v)
		if n != next[key] {
			t.Fatalf("key %s: received version %d, want %d: out of commit order", key, n, next[key])
		}
		next[key] = n + 1
	}
	if f := mysqlbinlog.Flushes(r); f == 0 || f > int64(len(committed))/4 {
		t.Errorf("%d checkpoints for %d rows: want a few, each removing many rows", f, len(committed))
	}
	t.Logf("%d rows published, %d rolled back, %d checkpoints", len(committed), len(rolledBack), mysqlbinlog.Flushes(r))
}

// The checkpoint records the progress in the relay's table: on MariaDB the GTID position read,
// past the transaction of the rows published.
func TestTheCheckpointRecordsTheGTIDPositionRead(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	if !isMariaDB(t, o) {
		t.Skip("MariaDB's GTIDs: a MySQL set reads otherwise")
	}
	pub := newRecorder()
	stop := run(t, relayOn(t, o, pub, nil))
	ctx := context.Background()
	conn, err := o.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := o.insert(t, tx, "a", 0, 3)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var written string // the rows' transaction's GTID, domain-server-seq
	if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.last_gtid").Scan(&written); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the rows to arrive", func() bool { return pub.has(ids) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var progress, gtid, file string
	var pos int64
	if err := o.db.QueryRow(`SELECT progress, gtid_set, file, pos FROM binlog_relays WHERE name = ?`, forwarder.DefaultName).
		Scan(&progress, &gtid, &file, &pos); err != nil {
		t.Fatal(err)
	}
	if progress != "gtid" || file == "" || pos <= 4 {
		t.Fatalf("checkpoint: progress %q at %s:%d; want gtid, and where in the log", progress, file, pos)
	}
	// One GTID per domain, and the rows' domain at or past their transaction (other tests' and
	// the relay's own checkpoints move it on).
	domain, _, _ := strings.Cut(written, "-")
	wantSeq := seqOf(t, written)
	found := false
	seen := map[string]bool{}
	for _, g := range strings.Split(gtid, ",") {
		d, _, _ := strings.Cut(g, "-")
		if seen[d] {
			t.Errorf("checkpoint %s holds domain %s twice", gtid, d)
		}
		seen[d] = true
		if d == domain {
			found = true
			if seqOf(t, g) < wantSeq {
				t.Errorf("checkpoint %s is behind the published rows' transaction %s", gtid, written)
			}
		}
	}
	if !found {
		t.Errorf("checkpoint %s has no GTID of domain %s, the published rows' (%s)", gtid, domain, written)
	}
	t.Logf("rows written in %s, checkpoint %s (%s:%d)", written, gtid, file, pos)
}

func seqOf(t *testing.T, gtid string) int64 {
	t.Helper()
	parts := strings.Split(gtid, "-")
	n, err := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err != nil || len(parts) != 3 {
		t.Fatalf("GTID %q is not domain-server-seq", gtid)
	}
	return n
}

// A relay stopped and started again reads on from its checkpoint: rows written while it was
// down arrive, and none of the rows published before arrives again (its last checkpoint, at
// stop, covered them all).
func TestRestartReadsOnFromTheCheckpoint(t *testing.T) {
	t.Parallel()
	for _, filePos := range []bool{false, true} {
		t.Run("FilePosition="+strconv.FormatBool(filePos), func(t *testing.T) {
			t.Parallel()
			o := newOutbox(t)
			pub := newRecorder()
			tune := func(_ *forwarder.Config, c *mysqlbinlog.Config) { c.FilePosition = filePos }
			stop := run(t, relayOn(t, o, pub, tune))
			first := o.write(t, "a", 5)
			testenv.Eventually(t, 10*time.Second, "the first rows to arrive", func() bool { return pub.has(first) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := o.count(t, "1"); n != 0 {
				t.Fatalf("%d published rows left in the outbox after a clean stop, want 0", n)
			}
			down := o.writeFrom(t, "a", 5, 5)
			other := o.write(t, "b", 3)

			stop = run(t, relayOn(t, o, pub, tune))
			testenv.Eventually(t, 10*time.Second, "the rows written while down to arrive", func() bool { return pub.has(append(down, other...)) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if d := pub.duplicated(); len(d) > 0 {
				t.Errorf("after a clean stop, %d rows arrived again: %v", len(d), d)
			}
			var progress string
			if err := o.db.QueryRow(`SELECT progress FROM binlog_relays`).Scan(&progress); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{false: "gtid", true: "file"}[filePos]; progress != want {
				t.Errorf("checkpoint progress %q, want %q", progress, want)
			}
		})
	}
}

// A relay that dies without its last checkpoint loses nothing: the next one reads again from the
// checkpoint, and the rows published twice are exactly the ones left in the table — those
// published since the last checkpoint.
func TestACrashRepublishesOnlyWhatFollowsTheLastCheckpoint(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	pub := newRecorder()
	// Checkpoints every 20 rows: some rows published after the last one when it dies.
	tune := func(f *forwarder.Config, c *mysqlbinlog.Config) {
		c.FlushInterval, c.FlushRows, f.BatchSize = time.Hour, 20, 7
	}
	r := relayOn(t, o, pub, tune)
	mysqlbinlog.CrashOnStop(r)
	stop := run(t, r)
	var ids []string
	for i := range 10 {
		ids = append(ids, o.writeFrom(t, "k"+strconv.Itoa(i%3), i*5, 5)...)
	}
	testenv.Eventually(t, 10*time.Second, "every row to arrive", func() bool { return pub.has(ids) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	left := o.ids(t)
	if len(left) == 0 || len(left) == len(ids) {
		t.Fatalf("%d of %d rows left after the crash: want some checkpointed and some not (FlushRows 20)", len(left), len(ids))
	}

	stop = run(t, relayOn(t, o, pub, nil))
	testenv.Eventually(t, 10*time.Second, "the rows left to arrive again", func() bool {
		return len(pub.duplicated()) >= len(left)
	})
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dup := pub.duplicated()
	if len(dup) != len(left) {
		t.Errorf("%d rows published twice, want the %d left in the table", len(dup), len(left))
	}
	for _, id := range left {
		if dup[id] != 2 {
			t.Errorf("row %s, left in the table, arrived %d times: want twice", id, dup[id])
		}
	}
	t.Logf("%d rows, %d left in the table at the crash, %d published twice", len(ids), len(left), len(dup))
}

// A relay group's first start publishes the rows already waiting in the outbox, then the rows
// of the log.
func TestTheFirstStartPublishesTheRowsWaiting(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	waiting := append(o.write(t, "a", 4), o.write(t, "b", 3)...)
	pub := newRecorder()
	stop := run(t, relayOn(t, o, pub, nil))
	later := o.writeFrom(t, "a", 4, 2)
	testenv.Eventually(t, 10*time.Second, "the waiting rows and the later ones to arrive", func() bool { return pub.has(append(waiting, later...)) })
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var backfilled int
	if err := o.db.QueryRow(`SELECT backfilled FROM binlog_relays`).Scan(&backfilled); err != nil {
		t.Fatal(err)
	}
	if backfilled != 1 {
		t.Errorf("checkpoint backfilled = %d after the table's rows were published, want 1", backfilled)
	}
	next := 0
	for _, p := range pub.payloads() {
		if key, v, _ := strings.Cut(p, ":"); key == "a" {
			if n, _ := strconv.Atoi(v); n != next {
				t.Fatalf("key a: received %d, want %d", n, next)
			}
			next++
		}
	}
}

// A row the broker refuses backs off, its attempts recorded in the outbox as the polling relay
// records them, with its key's later rows behind it and other keys flowing; at MaxAttempts it is
// dead-lettered there and stays; its key's later rows go on. A replay publishes it again.
func TestAFailingRowBacksOffThenIsDeadLetteredAndReplayed(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	var refuse atomic.Bool
	refuse.Store(true)
	pub := newRecorder()
	pub.fail = func(m *message.Message) bool { return refuse.Load() && string(m.Payload) == "bad:0" }
	r := relayOn(t, o, pub, func(f *forwarder.Config, _ *mysqlbinlog.Config) {
		f.MaxAttempts = 4
		f.Backoff = forwarder.Backoff{Initial: 150 * time.Millisecond, Max: 150 * time.Millisecond, Multiplier: 1}
	})
	stop := run(t, r)
	bad := o.write(t, "bad", 3)
	good := o.write(t, "good", 2)
	testenv.Eventually(t, 10*time.Second, "the other key's rows to arrive", func() bool { return pub.has(good) })
	testenv.Eventually(t, 10*time.Second, "the failed attempts to be recorded", func() bool {
		return o.count(t, "uuid = ? AND attempts >= 1 AND next_attempt_at IS NOT NULL AND last_error LIKE '%refuses%'", bad[0]) == 1
	})
	if n := pub.count(bad[1]) + pub.count(bad[2]); n != 0 {
		t.Fatalf("the failing key's later rows arrived (%d) while its first backs off", n)
	}
	// The checkpoint cannot pass the row backing off; the rows published behind it leave the
	// table all the same.
	testenv.Eventually(t, 10*time.Second, "the other key's rows to leave the outbox", func() bool {
		return o.count(t, "uuid IN (?, ?)", good[0], good[1]) == 0
	})
	testenv.Eventually(t, 10*time.Second, "the failing row to be dead-lettered", func() bool {
		return o.count(t, "uuid = ? AND attempts = 4 AND dead_lettered_at IS NOT NULL AND next_attempt_at IS NULL", bad[0]) == 1
	})
	testenv.Eventually(t, 10*time.Second, "its key's later rows to go on", func() bool { return pub.has(bad[1:]) })
	testenv.Eventually(t, 10*time.Second, "the published rows to leave the table, the dead letter to stay", func() bool {
		return o.count(t, "1") == 1
	})

	refuse.Store(false)
	replayed, err := o.store.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{All: true})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay: %v, %d rows", err, len(replayed))
	}
	testenv.Eventually(t, 10*time.Second, "the replayed dead letter to arrive", func() bool { return pub.count(bad[0]) == 1 })
	testenv.Eventually(t, 10*time.Second, "it to leave the table", func() bool { return o.count(t, "1") == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A relay starting again takes a backing-off row's attempts from the outbox: the count goes on
// instead of starting over.
func TestAttemptsRecordedSurviveARestart(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	pub := newRecorder()
	pub.fail = func(m *message.Message) bool { return string(m.Payload) == "bad:0" }
	tune := func(f *forwarder.Config, _ *mysqlbinlog.Config) {
		f.MaxAttempts = 3
		f.Backoff = forwarder.Backoff{Initial: 100 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 1}
	}
	stop := run(t, relayOn(t, o, pub, tune))
	bad := o.write(t, "bad", 1)
	testenv.Eventually(t, 10*time.Second, "two failed attempts to be recorded", func() bool {
		return o.count(t, "uuid = ? AND attempts = 2", bad[0]) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	stop = run(t, relayOn(t, o, pub, tune))
	testenv.Eventually(t, 10*time.Second, "the third attempt to dead-letter it", func() bool {
		return o.count(t, "uuid = ? AND attempts = 3 AND dead_lettered_at IS NOT NULL", bad[0]) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A second relay of the group waits while the first reads the log, and reads on from its
// checkpoint once the first stops.
func TestASecondRelayOfTheGroupWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	pub := newRecorder()
	stop := run(t, relayOn(t, o, pub, nil))
	second := relayOn(t, o, pub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second relay: %v", err)
		}
	}()
	ids := o.write(t, "a", 3)
	testenv.Eventually(t, 10*time.Second, "the rows to arrive", func() bool { return pub.has(ids) })
	if second.Active() {
		t.Fatal("the second relay reads the log while the first does")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second.Reading():
	case <-time.After(10 * time.Second):
		t.Fatal("the second relay did not take over within 10s of the first one's stop")
	}
	more := o.writeFrom(t, "a", 3, 2)
	testenv.Eventually(t, 10*time.Second, "the later rows to arrive through the second relay", func() bool { return pub.has(more) })
	if d := pub.duplicated(); len(d) > 0 {
		t.Errorf("%d rows arrived twice across a clean hand-over: %v", len(d), d)
	}
}
