package pglog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a broker that keeps what it received, in order, as an inbox sees it.
type recorder struct {
	mu    sync.Mutex
	seen  map[string]int // message id → deliveries
	order []*message.Message
	// after, when set, runs after each delivery with their count so far.
	after func(n int)
}

func newRecorder() *recorder { return &recorder{seen: map[string]int{}} }

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	for _, m := range msgs {
		r.seen[m.UUID]++
		r.order = append(r.order, m)
	}
	n, after := len(r.order), r.after
	r.mu.Unlock()
	if after != nil {
		after(n)
	}
	return nil
}

func (r *recorder) Close() error { return nil }

// has reports whether every id was received.
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

// duplicates counts deliveries beyond the first.
func (r *recorder) duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := 0
	for _, n := range r.seen {
		d += n - 1
	}
	return d
}

func (r *recorder) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// relayOn builds a log relay on pg publishing to pub; the slot and publication are dropped when
// the test ends.
func relayOn(t *testing.T, pg *testenv.PG, pub message.Publisher, tune func(*forwarder.Config, *pglog.Config)) *pglog.Relay {
	t.Helper()
	fcfg := forwarder.Config{Store: pg.Store, Publisher: pub, Backoff: forwarder.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 2}}
	cfg := pglog.Config{Pool: pg.Pool, FlushInterval: 50 * time.Millisecond, StatusInterval: 200 * time.Millisecond}
	if tune != nil {
		tune(&fcfg, &cfg)
	}
	f, err := forwarder.New(fcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Forwarder = f
	r, err := pglog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		// The slot may still be held by a relay's closing connection: retry briefly. One still held
		// after that is a relay that outlived its Run, and would take a slot from the tests after.
		testenv.Eventually(t, 10*time.Second, "slot "+r.SlotName()+" to be dropped", func() bool {
			_, err := pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, r.SlotName())
			return err == nil
		})
		_, _ = pg.Pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{r.SlotName()}.Sanitize())
	})
	return r
}

// run starts r and returns a stop that cancels it and waits for Run's return.
func run(t *testing.T, r *pglog.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Reading():
	case err := <-done:
		cancel()
		t.Fatalf("relay ended before reading its slot: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("relay did not start reading its slot within 30s")
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

// write commits n events of key in one transaction and returns their ids.
func write(t *testing.T, pg *testenv.PG, key string, n int) []string {
	t.Helper()
	return writeTo(t, pg, "orders", key, n)
}

// writeTo is write to topic.
func writeTo(t *testing.T, pg *testenv.PG, topic, key string, n int) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	ids := make([]string, n)
	msgs := make([]store.OutboxMessage, n)
	for i := range msgs {
		ids[i] = uuid.Must(uuid.NewV7()).String()
		msgs[i] = store.OutboxMessage{UUID: ids[i], Topic: topic, PartitionKey: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i)), Metadata: []byte("{}")}
	}
	if err := pg.Store.UnwrapTx(tx).InsertOutbox(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// N writers commit and roll back events over many keys, each key's writers serialized by its
// aggregate's row: every committed event arrives once, in commit order within its key, and no
// rolled-back event ever does.
func TestCommittedEventsArriveOnceInCommitOrderPerKey(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pg.Exec(t, `CREATE TABLE {{schema}}.aggregates (id text PRIMARY KEY, version int NOT NULL)`)
	const keys, writers, txns = 40, 8, 50
	for k := range keys {
		pg.Exec(t, `INSERT INTO {{schema}}.aggregates VALUES ($1, 0)`, fmt.Sprintf("k%02d", k))
	}
	pub := newRecorder()
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.BatchSize = 64; f.MaxInFlight = 8 })
	stop := run(t, r)

	var (
		mu         sync.Mutex
		committed  []string
		rolledBack []string
	)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for range txns {
				key := fmt.Sprintf("k%02d", rnd.IntN(keys))
				err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
					var version int
					if err := tx.QueryRow(ctx, pg.Schema.Render(`UPDATE {{schema}}.aggregates SET version = version + 1 WHERE id = $1 RETURNING version`), key).Scan(&version); err != nil {
						return err
					}
					n := 1 + rnd.IntN(3)
					msgs := make([]store.OutboxMessage, n)
					ids := make([]string, n)
					for i := range msgs {
						ids[i] = uuid.Must(uuid.NewV7()).String()
						msgs[i] = store.OutboxMessage{UUID: ids[i], Topic: "orders", PartitionKey: key,
							Payload: fmt.Appendf(nil, "%s:%06d:%d", key, version, i), Metadata: fmt.Appendf(nil, `{"id":%q}`, ids[i])}
					}
					if err := pg.Store.UnwrapTx(tx).InsertOutbox(ctx, msgs); err != nil {
						return err
					}
					if rnd.IntN(4) == 0 {
						mu.Lock()
						rolledBack = append(rolledBack, ids...)
						mu.Unlock()
						return errRollback
					}
					mu.Lock() // the commit's order within a key is its version's
					committed = append(committed, ids...)
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every committed event published", func() bool { return pub.has(committed) })
	// Rows are removed once published; waiting for that also lets a late rolled-back one show.
	testenv.Eventually(t, 10*time.Second, "published rows removed", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := pub.duplicates(); d != 0 {
		t.Errorf("%d duplicate deliveries without any fault", d)
	}
	for _, id := range rolledBack {
		if pub.count(id) != 0 {
			t.Errorf("rolled-back event %s was published", id)
		}
	}
	last := map[string]string{}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, m := range pub.order {
		if got := m.Metadata.Get("id"); got != m.UUID {
			t.Errorf("message %s arrived with the metadata of %q", m.UUID, got)
		}
		p := string(m.Payload)
		key := p[:strings.IndexByte(p, ':')]
		if prev, ok := last[key]; ok && p <= prev {
			t.Errorf("key %s: %s published after %s", key, p, prev)
		}
		last[key] = p
	}
	t.Logf("%d committed, %d rolled back, %d deliveries", len(committed), len(rolledBack), len(pub.order))
}

var errRollback = errors.New("roll back")

// Events committed while the relay is stopped arrive when it starts again: it never starts from
// the server's current position.
func TestEventsCommittedWhileStoppedArrive(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := newRecorder()
	stop := run(t, relayOn(t, pg, pub, nil))
	first := write(t, pg, "a", 3)
	testenv.Eventually(t, 10*time.Second, "first events", func() bool { return pub.has(first) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var later []string
	for i := range 5 {
		later = append(later, write(t, pg, fmt.Sprintf("k%d", i), 2)...)
	}
	run(t, relayOn(t, pg, pub, nil))
	testenv.Eventually(t, 10*time.Second, "events committed while stopped", func() bool { return pub.has(later) })
	if d := pub.duplicates(); d != 0 {
		t.Errorf("%d duplicates after a clean stop", d)
	}
}

// A relay killed after publishing and before confirming loses nothing: the next one publishes
// again what was not confirmed, and no more.
func TestKilledBeforeAcknowledgementLosesNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	// The slot exists and its checkpoint is set: what follows is read from the log.
	if err := run(t, relayOn(t, pg, newRecorder(), nil))(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 20 {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i%7), 10)...)
	}
	pub := newRecorder()
	ctx, kill := context.WithCancel(context.Background())
	pub.after = func(n int) {
		if n == 50 {
			// A slow publish: status updates go out meanwhile (StatusInterval 200ms), and must
			// not confirm what is not published.
			time.Sleep(600 * time.Millisecond) //nolint:forbidigo // the slow publish: three StatusIntervals long
			kill()
		}
	}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, c *pglog.Config) { f.BatchSize = 20 })
	pglog.CrashOnStop(r)
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	kill()
	pub.mu.Lock()
	before := len(pub.order)
	pub.after = nil
	pub.mu.Unlock()

	run(t, relayOn(t, pg, pub, nil))
	testenv.Eventually(t, 20*time.Second, "every event after the restart", func() bool { return pub.has(ids) })
	d := pub.duplicates()
	t.Logf("%d published before the kill, %d duplicates after", before, d)
	if d > before {
		t.Errorf("%d duplicates, more than the %d published before the kill", d, before)
	}
}

// An idle outbox retains no WAL while other tables write: the relay confirms the server's WAL
// end when it has nothing in flight.
func TestIdleOutboxRetainsNoWAL(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	r := relayOn(t, pg, newRecorder(), nil)
	run(t, r)
	pg.Exec(t, `CREATE TABLE {{schema}}.busy (id bigint, pad text)`)
	const wrote = 24 << 20
	start := pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	for pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`)-start < wrote {
		pg.Exec(t, `INSERT INTO {{schema}}.busy SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g`)
	}
	pg.Exec(t, `SELECT pg_switch_wal()`)
	target := pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	testenv.Eventually(t, 20*time.Second, "the slot confirms past the other table's WAL", func() bool {
		return pg.Int(t, `SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1`, r.SlotName()) >= target
	})
	const bound = 8 << 20
	retained := 0
	testenv.Eventually(t, 20*time.Second, "the slot retains under 8 MiB", func() bool {
		pg.Exec(t, `CHECKPOINT`) // logs the running transactions the slot's restart position moves by
		retained = pg.Int(t, `SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, r.SlotName())
		return retained < bound
	})
	t.Logf("retained %d bytes after %d bytes of other tables' WAL", retained, wrote)
}

// A dropped slot is detected at start: the relay backfills exactly the events committed since
// (the rows left in the outbox), then follows the log.
func TestDroppedSlotBackfillsTheGap(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := newRecorder()
	r := relayOn(t, pg, pub, nil)
	stop := run(t, r)
	first := write(t, pg, "a", 10)
	testenv.Eventually(t, 10*time.Second, "first events", func() bool { return pub.has(first) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("%d published rows left in the outbox after a clean stop", n)
	}
	testenv.Eventually(t, 10*time.Second, "the slot dropped once its reader has gone", func() bool {
		_, err := pg.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, r.SlotName())
		return err == nil
	})
	var gap []string
	for i := range 5 {
		gap = append(gap, write(t, pg, fmt.Sprintf("k%d", i), 3)...)
	}
	run(t, relayOn(t, pg, pub, nil))
	after := write(t, pg, "a", 4)
	testenv.Eventually(t, 10*time.Second, "the gap and what follows", func() bool { return pub.has(gap) && pub.has(after) })
	if d := pub.duplicates(); d != 0 {
		t.Errorf("%d duplicates: the backfill read more than the gap", d)
	}
}

// What the relay cannot work with is refused at start with what to do.
func TestStartChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runErr := func(t *testing.T, r *pglog.Relay) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return r.Run(ctx)
	}
	t.Run("wal_level", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewPG(t) // the shared server: wal_level = replica
		err := runErr(t, relayOn(t, pg, newRecorder(), nil))
		if err == nil || !strings.Contains(err.Error(), "wal_level = logical") {
			t.Fatalf("got %v, want an error saying to set wal_level = logical", err)
		}
	})
	t.Run("replication privilege", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewLogicalPG(t)
		role := string(pg.Schema) + "_r"
		pg.Exec(t, `CREATE ROLE `+role+` LOGIN`)
		t.Cleanup(func() { _, _ = pg.Pool.Exec(ctx, `DROP ROLE IF EXISTS `+role) })
		pcfg, err := pgxpool.ParseConfig(pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.ConnConfig.User = role
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		as := *pg
		as.Pool, as.Store = pool, pg.StoreOn(t, pool)
		err = runErr(t, relayOn(t, &as, newRecorder(), nil))
		if err == nil || !strings.Contains(err.Error(), "REPLICATION") {
			t.Fatalf("got %v, want an error saying to grant REPLICATION", err)
		}
	})
	t.Run("publication altered", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewLogicalPG(t)
		r := relayOn(t, pg, newRecorder(), nil)
		if err := run(t, r)(); err != nil {
			t.Fatal(err)
		}
		pg.Exec(t, `CREATE TABLE {{schema}}.other (id int)`)
		pg.Exec(t, `ALTER PUBLICATION `+pgx.Identifier{r.SlotName()}.Sanitize()+` ADD TABLE {{schema}}.other`)
		err := runErr(t, relayOn(t, pg, newRecorder(), nil))
		if err == nil || !strings.Contains(err.Error(), "altered") {
			t.Fatalf("got %v, want an error saying the publication was altered", err)
		}
	})
}

// tablePublisher is a broker that records deliveries in a table, so that relays in two processes
// can be checked together: received(id, n) counts each message's deliveries.
type tablePublisher struct {
	pool   *pgxpool.Pool
	schema testenv.Schema
}

func (p tablePublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.pool.Exec(context.Background(), p.schema.Render(`INSERT INTO {{schema}}.received (id, n) VALUES ($1, 1)
			ON CONFLICT (id) DO UPDATE SET n = received.n + 1`), m.UUID); err != nil {
			return err
		}
	}
	return nil
}

func (tablePublisher) Close() error { return nil }

const (
	envHelperURL    = "PGLOG_HELPER_URL"
	envHelperSchema = "PGLOG_HELPER_SCHEMA"
)

// TestHelperLogRelay is the active relay of TestStandbyTakesOverAfterSIGKILL, in a process of its
// own; it does nothing in a normal run.
func TestHelperLogRelay(t *testing.T) {
	url, schema := os.Getenv(envHelperURL), os.Getenv(envHelperSchema)
	if url == "" {
		return // only meaningful as the subprocess
	}
	pg := testenv.AttachPG(t, url, schema)
	f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: tablePublisher{pg.Pool, pg.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := pglog.New(pglog.Config{Forwarder: f, Pool: pg.Pool, FlushInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-r.Reading()
		fmt.Println("READING")
	}()
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A standby relay takes over the slot soon after the active one is killed with SIGKILL, and
// nothing is lost; while the active one lives, the standby does not read.
func TestStandbyTakesOverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pg.Exec(t, `CREATE TABLE {{schema}}.received (id text PRIMARY KEY, n int NOT NULL)`)
	cmd := testenv.StartHelperProcess(t, "TestHelperLogRelay", []string{envHelperURL + "=" + pg.URL, envHelperSchema + "=" + string(pg.Schema)}, "READING")

	standby := relayOn(t, pg, tablePublisher{pg.Pool, pg.Schema}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- standby.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("standby Run: %v", err)
		}
	})

	var ids []string
	for i := range 10 {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i), 5)...)
	}
	received := func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.received WHERE id = ANY($1)`, ids) == len(ids)
	}
	testenv.Eventually(t, 20*time.Second, "events published by the active relay", received)
	if standby.Active() {
		t.Fatal("the standby reads the slot while the active relay lives")
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-standby.Reading():
	case <-time.After(20 * time.Second):
		t.Fatal("the standby did not take over within 20s of the SIGKILL")
	}
	takeover := time.Since(killed)
	for i := range 10 {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i), 5)...)
	}
	testenv.Eventually(t, 20*time.Second, "every event after the takeover", received)
	dups := pg.Int(t, `SELECT coalesce(sum(n - 1), 0) FROM {{schema}}.received`)
	t.Logf("takeover %s after SIGKILL; %d duplicates", takeover, dups)
	// The new reader publishes again what the killed one had not confirmed (the first events,
	// confirmed at most once a second); should its own session restart, what it had not confirmed
	// either. Never more than every event once more.
	if dups > len(ids) {
		t.Errorf("%d duplicates, more than the %d events written", dups, len(ids))
	}
}

// failing is a broker that refuses the messages of one key, and can be made unreachable.
type failing struct {
	*recorder
	badKey string
	down   atomic.Bool
	calls  atomic.Int64
}

func (f *failing) Publish(topic string, msgs ...*message.Message) error {
	f.calls.Add(1)
	if f.down.Load() {
		return outboxkit.Unreachable(errors.New("connection refused"))
	}
	for _, m := range msgs {
		if m.Metadata.Get(outboxkit.MetadataPartitionKey) == f.badKey {
			return errors.New("message too large")
		}
	}
	return f.recorder.Publish(topic, msgs...)
}

// A key the broker keeps refusing backs off and is dead-lettered alone, in the outbox; the other
// keys flow meanwhile and the slot moves past it.
func TestFailingKeyIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &failing{recorder: newRecorder(), badKey: "bad"}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.MaxAttempts = 3 })
	run(t, r)
	bad := write(t, pg, "bad", 1)
	good := write(t, pg, "good", 3)
	testenv.Eventually(t, 10*time.Second, "the other key's events", func() bool { return pub.has(good) })
	testenv.Eventually(t, 10*time.Second, "the refused event dead-lettered after 3 attempts", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND attempts = 3 AND uuid = $1::uuid`, bad[0]) == 1
	})
	after := write(t, pg, "good", 2)
	end := pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	testenv.Eventually(t, 10*time.Second, "events after the dead letter", func() bool { return pub.has(after) })
	testenv.Eventually(t, 10*time.Second, "the slot past the dead letter", func() bool {
		return pg.Int(t, `SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1`, r.SlotName()) >= end
	})
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
		t.Errorf("%d rows left in the outbox, want the dead letter alone", n)
	}
}

// A broker outage opens the circuit and burns no attempt: with MaxAttempts 1, nothing is
// dead-lettered, and everything arrives once the broker is back.
func TestBrokerOutageBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &failing{recorder: newRecorder()}
	pub.down.Store(true)
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) {
		f.MaxAttempts = 1
		f.CircuitBackoff = forwarder.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	})
	run(t, r)
	var ids []string
	for i := range 5 {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i), 2)...)
	}
	testenv.Eventually(t, 10*time.Second, "the relay tried the broker several times", func() bool { return pub.calls.Load() >= 3 })
	pub.down.Store(false)
	testenv.Eventually(t, 10*time.Second, "every event once the broker is back", func() bool { return pub.has(ids) })
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows dead-lettered by an outage", n)
	}
}

// A relay killed during its backfill (the first start reads the rows already in the outbox) does
// the backfill again at its next start: nothing lost.
func TestKilledDuringBackfillLosesNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	var ids []string
	for i := range 20 {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i%7), 10)...)
	}
	pub := newRecorder()
	ctx, kill := context.WithCancel(context.Background())
	pub.after = func(n int) {
		if n == 50 {
			kill()
		}
	}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.BatchSize = 20 })
	pglog.CrashOnStop(r)
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	before := len(pub.order)
	pub.after = nil
	pub.mu.Unlock()
	run(t, relayOn(t, pg, pub, nil))
	testenv.Eventually(t, 20*time.Second, "every event after the restart", func() bool { return pub.has(ids) })
	if d := pub.duplicates(); d > before {
		t.Errorf("%d duplicates, more than the %d published before the kill", d, before)
	}
}

// The relay reports its slot as the server sees it, and the keys it holds back after a failure.
func TestSlotStatusShowsParkedKeys(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &failing{recorder: newRecorder(), badKey: "bad"}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) {
		f.MaxAttempts = 1000
		f.Backoff = forwarder.Backoff{Initial: time.Second, Max: time.Second, Multiplier: 1}
	})
	run(t, r)
	write(t, pg, "bad", 2)
	good := write(t, pg, "good", 1)
	testenv.Eventually(t, 10*time.Second, "the other key's event", func() bool { return pub.has(good) })
	var s forwarder.SlotStatus
	testenv.Eventually(t, 10*time.Second, "one parked key on a read slot", func() bool {
		var err error
		s, err = r.SlotStatus(context.Background())
		return err == nil && s.ParkedKeys == 1 && s.Exists && s.Active && s.WALStatus == "reserved"
	})
	if s.Slot != r.SlotName() || s.Mode != "table" || s.SafeWALBytes <= 0 {
		t.Errorf("slot status %+v", s)
	}
}

// holder is a broker that holds the publishes of one key until released.
type holder struct {
	*recorder
	key      string
	entered  chan struct{} // closed when the first publish of key is held
	enter    sync.Once
	release  chan struct{}
	released sync.Once
}

func newHolder(key string) *holder {
	return &holder{recorder: newRecorder(), key: key, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *holder) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(outboxkit.MetadataPartitionKey) == g.key {
			g.enter.Do(func() { close(g.entered) })
			<-g.release
		}
	}
	return g.recorder.Publish(topic, msgs...)
}

func (g *holder) open() { g.released.Do(func() { close(g.release) }) }

// A key whose publish has not been confirmed holds its own later events alone: the events of other
// keys, and those without a key, decoded after it, are published meanwhile. There is no round for
// them to wait out.
func TestEventsDoNotWaitForAnotherKeysPublish(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := newHolder("slow")
	r := relayOn(t, pg, pub, nil)
	run(t, r)
	t.Cleanup(pub.open) // before the relay stops
	first := write(t, pg, "slow", 1)
	select {
	case <-pub.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow key's event never reached the broker")
	}
	second := write(t, pg, "slow", 1)
	var others []string
	for i := range 5 {
		others = append(others, write(t, pg, fmt.Sprintf("k%d", i), 2)...)
	}
	others = append(others, write(t, pg, "", 2)...)
	testenv.Eventually(t, 10*time.Second, "the other events while the slow key's publish is held", func() bool { return pub.has(others) })
	if pub.count(first[0]) != 0 || pub.count(second[0]) != 0 {
		t.Fatal("an event of the slow key published while its first publish was held")
	}
	pub.open()
	testenv.Eventually(t, 10*time.Second, "the slow key's events once released", func() bool {
		return pub.has(first) && pub.has(second)
	})
	if a, b := pub.index(first[0]), pub.index(second[0]); a > b {
		t.Errorf("the slow key's second event published at %d, before its first at %d", b, a)
	}
}

// tracker is a broker that takes a moment to confirm, and records which keys had more than one
// message in flight at once.
type tracker struct {
	*recorder
	mu        sync.Mutex
	inFlight  map[string]int
	overlaps  []string
	active    int
	maxActive int
}

func (p *tracker) Publish(topic string, msgs ...*message.Message) error {
	key := msgs[0].Metadata.Get(outboxkit.MetadataPartitionKey)
	p.mu.Lock()
	p.inFlight[key]++
	if p.inFlight[key] > 1 && key != "" {
		p.overlaps = append(p.overlaps, key)
	}
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	p.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond) //nolint:forbidigo // the simulated broker's confirmation, up to 1.5 ms
	err := p.recorder.Publish(topic, msgs...)
	p.mu.Lock()
	p.inFlight[key]--
	p.active--
	p.mu.Unlock()
	return err
}

// Under concurrency — many keys in flight, writers committing meanwhile — a key never has two
// events in flight at once, and its events arrive in commit order.
func TestKeyHasOneEventInFlightInOrder(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &tracker{recorder: newRecorder(), inFlight: map[string]int{}}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.MaxInFlight = 16 })
	stop := run(t, r)
	const keys, txns = 6, 40
	ids := make([][]string, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() { // one writer a key: its commit order is this loop's
			defer wg.Done()
			for range txns {
				ids[k] = append(ids[k], write(t, pg, fmt.Sprintf("k%d", k), 1+rand.IntN(3))...)
			}
		}()
	}
	wg.Wait()
	var all []string
	for _, k := range ids {
		all = append(all, k...)
	}
	testenv.Eventually(t, 30*time.Second, "every event", func() bool { return pub.has(all) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.overlaps) > 0 {
		t.Errorf("keys with two events in flight at once: %v", pub.overlaps)
	}
	if pub.maxActive < 2 {
		t.Errorf("at most %d event in flight: the keys were not published side by side", pub.maxActive)
	}
	// The payload is "key:index in its transaction"; ids[k] is the key's commit order.
	pub.recorder.mu.Lock()
	defer pub.recorder.mu.Unlock()
	next := map[string]int{}
	for _, m := range pub.order {
		key := strings.SplitN(string(m.Payload), ":", 2)[0]
		k, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
		if i := next[key]; i < len(ids[k]) && ids[k][i] == m.UUID {
			next[key]++
			continue
		}
		t.Errorf("key %s: %s arrived out of commit order (expected %d-th event next)", key, m.UUID, next[key])
		return
	}
	t.Logf("%d events, up to %d in flight", len(all), pub.maxActive)
}
