package mysqlbinlog_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// timeline records which relay began each publish, and when.
type timeline struct {
	mu     sync.Mutex
	starts map[string][]time.Time // by relay
}

func newTimeline() *timeline { return &timeline{starts: map[string][]time.Time{}} }

// as is pub as relay publishes through it, each publish's start recorded.
func (tl *timeline) as(relay string, pub message.Publisher) message.Publisher {
	return &timed{Publisher: pub, tl: tl, relay: relay}
}

type timed struct {
	message.Publisher
	tl    *timeline
	relay string
}

func (p *timed) Publish(topic string, msgs ...*message.Message) error {
	p.tl.mu.Lock()
	p.tl.starts[p.relay] = append(p.tl.starts[p.relay], time.Now())
	p.tl.mu.Unlock()
	return p.Publisher.Publish(topic, msgs...)
}

// count is how many publishes relay began.
func (tl *timeline) count(relay string) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.starts[relay])
}

// first and last are when relay began its first and its last publish (zero for none).
func (tl *timeline) first(relay string) time.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if s := tl.starts[relay]; len(s) > 0 {
		return s[0]
	}
	return time.Time{}
}

func (tl *timeline) last(relay string) time.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if s := tl.starts[relay]; len(s) > 0 {
		return s[len(s)-1]
	}
	return time.Time{}
}

// writer commits one outbox row per transaction, keys k0…k7 in turn, until finished.
type writer struct {
	mu   sync.Mutex
	ids  []string
	err  error
	stop chan struct{}
	done chan struct{}
}

func startWriting(t *testing.T, o *outbox) *writer {
	t.Helper()
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			id, err := o.writeOne(fmt.Sprintf("k%d", i%8), i/8)
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.ids = append(w.ids, id)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.finish(t) })
	return w
}

// written is the ids of the rows committed so far.
func (w *writer) written() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ids[:len(w.ids):len(w.ids)]
}

// finish stops the writer and returns the ids of the rows it committed.
func (w *writer) finish(t *testing.T) []string {
	t.Helper()
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	if w.err != nil {
		t.Fatalf("write an outbox row: %v", w.err)
	}
	return w.ids
}

// writeOne commits one row of key, payload key:n, and returns its id.
func (o *outbox) writeOne(key string, n int) (string, error) {
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7()).String()
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	msg := store.OutboxMessage{UUID: id, Topic: "orders", PartitionKey: key, Payload: []byte(key + ":" + strconv.Itoa(n)), Metadata: []byte("{}")}
	if err := o.store.UnwrapTx(tx).InsertOutbox(ctx, []store.OutboxMessage{msg}); err != nil {
		return "", err
	}
	return id, tx.Commit()
}

// start runs r without waiting for it to read the binary log (a standby), until the test ends
// or stop.
func start(t *testing.T, r *mysqlbinlog.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// lockHolder is the id of the connection holding r's group's lock, 0 for none.
func lockHolder(t *testing.T, o *outbox, r *mysqlbinlog.Relay) int64 {
	t.Helper()
	var id sql.NullInt64
	if err := o.db.QueryRow("SELECT IS_USED_LOCK(?)", mysqlbinlog.LockName(r)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Int64
}

// The relay holding the lock stops publishing as soon as its lock connection is gone — here
// killed by the server (KILL), as an operator, wait_timeout or a restart of the server would —
// and not at its next checkpoint, which in this test never comes; it stands by, and the standby
// takes over. Nothing is lost, and once the second relay stops the first takes over again.
func TestARelayThatLosesItsLockConnectionStopsPublishingAndStandsBy(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	tl, pub := newTimeline(), newRecorder()
	// No checkpoint until a relay stops: its failure cannot be what stops the first relay.
	tune := func(_ *forwarder.Config, c *mysqlbinlog.Config) { c.FlushInterval, c.FlushRows = time.Hour, 1<<30 }
	first := relayOn(t, o, tl.as("first", pub), tune)
	run(t, first)
	// A ServerID of its own: the second relay's stream, once it takes over, does not end the
	// first one's (the server ends a replica's stream when another registers with its server_id).
	second := relayOn(t, o, tl.as("second", pub), func(f *forwarder.Config, c *mysqlbinlog.Config) {
		tune(f, c)
		c.ServerID = first.ServerID() ^ 1
	})
	stopSecond := start(t, second)
	w := startWriting(t, o)
	testenv.Eventually(t, 10*time.Second, "the first relay to publish", func() bool { return tl.count("first") >= 20 })
	if second.Active() {
		t.Fatal("the second relay reads the binary log while the first holds the lock")
	}

	id := lockHolder(t, o, first)
	killed := time.Now()
	if _, err := o.db.Exec(fmt.Sprintf("KILL %d", id)); err != nil {
		t.Fatalf("kill the lock's connection %d: %v", id, err)
	}
	var stopped, tookOver time.Time // when the test saw each
	testenv.Eventually(t, 10*time.Second, "the first relay to stop reading, and the second to take over", func() bool {
		now := time.Now()
		if stopped.IsZero() && !first.Active() {
			stopped = now
		}
		if tookOver.IsZero() && second.Active() {
			tookOver = now
		}
		return !stopped.IsZero() && !tookOver.IsZero()
	})
	sofar := w.written()
	testenv.Eventually(t, 10*time.Second, "the rows written until the second relay took over to arrive", func() bool { return pub.has(sofar) })
	// The first relay published nothing once it stopped reading, and stopped soon after the
	// kill, although rows kept coming and no checkpoint was due.
	last := tl.last("first")
	if last.After(stopped) {
		t.Errorf("the first relay published at %s, after it stopped reading at %s", last.Format(time.StampMicro), stopped.Format(time.StampMicro))
	}
	if d := last.Sub(killed); d > 2*time.Second {
		t.Errorf("the first relay went on publishing for %s after its lock connection was killed", d)
	}

	// The first relay stands by: it takes over again once the second stops.
	stopSecond()
	testenv.Eventually(t, 10*time.Second, "the first relay to take over again", first.Active)
	ids := w.finish(t)
	testenv.Eventually(t, 20*time.Second, "every row to arrive", func() bool { return pub.has(ids) })
	t.Logf("first relay stopped reading %s after its lock connection was killed (its last publish began %s after); "+
		"second relay reading %s after; %d rows, %d published more than once",
		stopped.Sub(killed), last.Sub(killed), tookOver.Sub(killed), len(ids), len(pub.duplicated()))
}

// gatedBroker lets budget publishes through, then holds every later one until open: a broker that
// stops answering, for as long as the test says.
type gatedBroker struct {
	message.Publisher
	g *gate
}

func (b gatedBroker) Publish(topic string, msgs ...*message.Message) error {
	b.g.pass()
	return b.Publisher.Publish(topic, msgs...)
}

// gate lets budget callers pass, then holds the others until open.
type gate struct {
	mu     sync.Mutex
	budget int
	shut   chan struct{} // closed by open
}

func newGate(budget int) *gate { return &gate{budget: budget, shut: make(chan struct{})} }

func (g *gate) pass() {
	g.mu.Lock()
	g.budget--
	free := g.budget >= 0
	g.mu.Unlock()
	if !free {
		<-g.shut
	}
}

// open lets every caller pass from now on; once only.
func (g *gate) open() { close(g.shut) }

// A relay whose host vanishes from the network — its connections silent, not closed — stops
// publishing within half its lease, before the server ends its lock connection (wait_timeout, the
// lease) and the standby takes over: the two never publish at once.
func TestARelayCutOffFromTheServerStopsBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	tl, pub := newTimeline(), newRecorder()
	const lease = 2 * time.Second
	proxy, through := testenv.ProxyURL(t, o.url)
	// A backlog of one key waiting in the table, which the first relay reads at its start and
	// publishes one row at a time; no checkpoint before a relay stops. Its broker stops answering
	// after 50 publishes: the relay holds in memory the rows it would go on publishing the moment
	// the broker answers again.
	var ids []string
	for i := range 10 {
		ids = append(ids, o.writeFrom(t, "k", i*100, 100)...)
	}
	g := newGate(50)
	first := relayOn(t, o, tl.as("first", gatedBroker{pub, g}), func(_ *forwarder.Config, c *mysqlbinlog.Config) {
		c.URL, c.FlushInterval, c.FlushRows = through, time.Hour, 1<<30
	})
	mysqlbinlog.ShortLease(first, lease)
	run(t, first)
	opened := false
	t.Cleanup(func() { // before the relay's stop (cleanups run last first)
		if !opened {
			g.open()
		}
	})
	testenv.Eventually(t, 10*time.Second, "the first relay to publish until its broker stops answering",
		func() bool { return tl.count("first") > 50 })
	second := relayOn(t, o, tl.as("second", pub), nil)
	start(t, second)

	proxy.Vanish()
	vanished := time.Now()
	testenv.Eventually(t, 20*time.Second, "the second relay to take over", second.Active)
	tookOver := time.Since(vanished)
	testenv.Eventually(t, 20*time.Second, "the second relay to publish", func() bool { return tl.count("second") > 0 })
	// The first relay's broker answers again: a relay that did not fence itself publishes on.
	g.open()
	opened = true
	proxy.Thaw()
	testenv.Eventually(t, 20*time.Second, "every row to arrive", func() bool { return pub.has(ids) })
	last, next := tl.last("first"), tl.first("second")
	if !last.Before(next) {
		t.Errorf("the first relay published at %s, after the second took over at %s: both published at once",
			last.Format(time.StampMicro), next.Format(time.StampMicro))
	}
	if n := tl.count("first"); n >= len(ids) {
		t.Errorf("the first relay published its whole backlog (%d rows): it was not stopped", n)
	}
	t.Logf("lease %s: the first relay's last publish began %s after its host vanished, the second relay read %s after (published %s after)",
		lease, last.Sub(vanished), tookOver, next.Sub(vanished))
}

const envHelperRelay = "MYSQLBINLOG_HELPER_RELAY" // the outbox's URL|database

// receiving is a broker that records deliveries in a table of the outbox's database, so that
// relays in two processes are checked together: received(id, n) counts each message's deliveries.
type receiving struct{ db *sql.DB }

func (p receiving) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.db.Exec(`INSERT INTO received (id, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1`, m.UUID); err != nil {
			return err
		}
	}
	return nil
}

func (receiving) Close() error { return nil }

// TestHelperBinlogRelay is the relay holding the lock in TestAStandbyTakesOverSoonAfterAKill, in
// a process of its own; it does nothing in a normal run.
func TestHelperBinlogRelay(t *testing.T) {
	spec := os.Getenv(envHelperRelay)
	if spec == "" {
		return // only meaningful as the subprocess
	}
	url, database, _ := strings.Cut(spec, "|")
	o := &outbox{url: url, database: database, db: testenv.OpenMySQL(t, url)}
	var err error
	if o.store, err = mysqlstore.New(o.db, mysqlstore.Config{Schema: database}); err != nil {
		t.Fatal(err)
	}
	r := relayOn(t, o, receiving{o.db}, nil)
	go func() {
		<-r.Reading()
		fmt.Println("READING")
	}()
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A standby takes over within moments of the SIGKILL of the relay holding the lock, in a
// process of its own, while writers write: the kernel closes the dead process's connections, and
// the server gives the lock to the standby at once. Every row arrives.
func TestAStandbyTakesOverSoonAfterAKill(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	if _, err := o.db.Exec(`CREATE TABLE received (id VARCHAR(64) PRIMARY KEY, n INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.StartHelperProcess(t, "TestHelperBinlogRelay", []string{envHelperRelay + "=" + o.url + "|" + o.database}, "READING")

	tl := newTimeline()
	standby := relayOn(t, o, tl.as("standby", receiving{o.db}), nil)
	start(t, standby)
	received := func() int {
		var n int
		if err := o.db.QueryRow(`SELECT COUNT(*) FROM received`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	w := startWriting(t, o)
	testenv.Eventually(t, 10*time.Second, "the relay process to publish", func() bool { return received() >= 20 })
	if standby.Active() {
		t.Fatal("the standby reads the binary log while the relay process holds the lock")
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Well under the lease: the server released the lock as the kernel closed the dead process's
	// connection, not once the lease ran out.
	select {
	case <-standby.Reading():
	case <-time.After(5 * time.Second):
		t.Fatal("the standby did not take over within 5s of the SIGKILL")
	}
	reads := time.Since(killed)
	testenv.Eventually(t, 10*time.Second, "the standby to publish", func() bool { return tl.count("standby") > 0 })
	publishes := tl.first("standby").Sub(killed)
	ids := w.finish(t)
	testenv.Eventually(t, 20*time.Second, "every row to arrive", func() bool { return received() == len(ids) })
	var dups int
	if err := o.db.QueryRow(`SELECT COALESCE(SUM(n - 1), 0) FROM received`).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL → standby reading %s, its first publish %s; %d rows, %d deliveries more than once", reads, publishes, len(ids), dups)
}
