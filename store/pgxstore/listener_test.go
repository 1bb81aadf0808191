package pgxstore_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// relayProbe listens through a store's Waker as a relay does and counts what it is told.
type relayProbe struct {
	wakes, listening atomic.Int64
	mu               sync.Mutex
	errs             []error
	stop             func()
}

func (p *relayProbe) loggedErrors() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs...)
}

func listenThrough(t *testing.T, s store.Store) *relayProbe {
	t.Helper()
	w := s.Waker()
	if w == nil {
		t.Fatal("the store has no Waker")
	}
	p := &relayProbe{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Listen(ctx, func() { p.wakes.Add(1) }, func() { p.listening.Add(1) }, func(err error) {
			p.mu.Lock()
			p.errs = append(p.errs, err)
			p.mu.Unlock()
		})
	}()
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Error("Listen did not return within 5s of its context ending")
			}
		})
	}
	t.Cleanup(p.stop)
	return p
}

// withApplicationName is rawURL with its connections named name.
func withApplicationName(t *testing.T, rawURL, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

func backends(t *testing.T, pg *testenv.PG, name string) int {
	t.Helper()
	return pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name)
}

// eachCommitWakesItsRelay commits an event in each schema in turn and checks that its relay is
// woken and no other: notifications arrive on the one connection in commit order, so a wrong
// wake-up from one commit would show before the next commit's right one.
func eachCommitWakesItsRelay(t *testing.T, pgs []*testenv.PG, stores []*pgxstore.Store, relays []*relayProbe) {
	t.Helper()
	base := make([]int64, len(relays))
	for i, r := range relays {
		base[i] = r.wakes.Load()
	}
	for i := range pgs {
		publish(t, pgs[i], stores[i], "k", 1)
		testenv.Eventually(t, 5*time.Second, "the relay of the schema committed to to be woken", func() bool {
			return relays[i].wakes.Load() > base[i]
		})
		base[i] = relays[i].wakes.Load()
		for j, r := range relays {
			if got := r.wakes.Load(); j != i && got != base[j] {
				t.Fatalf("a commit in schema %d woke the relay of schema %d too (%d wake-ups, was %d)", i, j, got, base[j])
			}
		}
	}
}

// Three schemas of one database share one LISTEN connection: one backend, each commit wakes its
// own schema's relay, and when the backend is terminated the listener reconnects and tells every
// relay it listens again. Once no relay listens, it holds no connection.
func TestListenerSharesOneConnectionAcrossSchemas(t *testing.T) {
	t.Parallel()
	pgs := []*testenv.PG{testenv.NewPG(t), testenv.NewPG(t), testenv.NewPG(t)}
	name := testenv.UniqueName(t, "listen")
	l, err := pgxstore.NewListener(withApplicationName(t, pgs[0].URL, name), pgxstore.ListenerConfig{Retry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	if n := backends(t, pgs[0], name); n != 0 {
		t.Fatalf("%d backends before any relay listens, want none", n)
	}
	var (
		stores []*pgxstore.Store
		relays []*relayProbe
	)
	for _, pg := range pgs {
		s, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), Listener: l})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
		relays = append(relays, listenThrough(t, s))
	}
	// Two relays of one schema share its channel too.
	twin := listenThrough(t, stores[1])
	all := append([]*relayProbe{twin}, relays...)
	listeningTimes := func(n int64) func() bool {
		return func() bool {
			for _, r := range all {
				if r.listening.Load() < n {
					return false
				}
			}
			return true
		}
	}
	testenv.Eventually(t, 10*time.Second, "every relay to be listening", listeningTimes(1))
	if n := backends(t, pgs[0], name); n != 1 {
		t.Fatalf("%d backends named %s for 3 schemas and 4 relays, want 1", n, name)
	}
	before := twin.wakes.Load()
	eachCommitWakesItsRelay(t, pgs, stores, relays)
	if twin.wakes.Load() == before {
		t.Fatal("the second relay of schema 1 was not woken by its commit")
	}

	kill(t, pgs[0], name)
	testenv.Eventually(t, 10*time.Second, "every relay to be told it listens again after the reconnection", listeningTimes(2))
	if n := backends(t, pgs[0], name); n != 1 {
		t.Fatalf("%d backends named %s after the reconnection, want 1", n, name)
	}
	eachCommitWakesItsRelay(t, pgs, stores, relays)
	if errs := relays[0].loggedErrors(); len(errs) == 0 {
		t.Fatal("the lost connection was reported to no relay")
	}

	// A relay that stops is no longer woken; when the last stops, the connection closes.
	relays[2].stop()
	stopped := relays[2].wakes.Load()
	eachCommitWakesItsRelay(t, pgs[:2], stores[:2], relays[:2])
	woken := relays[0].wakes.Load()
	publish(t, pgs[2], stores[2], "k", 1)
	publish(t, pgs[0], stores[0], "k", 1) // after schema 2's commit on the one connection
	testenv.Eventually(t, 5*time.Second, "schema 0's relay to be woken", func() bool { return relays[0].wakes.Load() > woken })
	if relays[2].wakes.Load() != stopped {
		t.Fatal("a relay was woken after its Listen returned")
	}
	for _, r := range all {
		r.stop()
	}
	testenv.Eventually(t, 10*time.Second, "the listener's connection to close once no relay listens", func() bool {
		return backends(t, pgs[0], name) == 0
	})
}

// Relays of two schemas, polling once an hour, publish each commit of their own schema at once,
// woken through the one shared connection.
func TestRelaysOfSchemasAreWokenThroughOneListener(t *testing.T) {
	t.Parallel()
	pgs := []*testenv.PG{testenv.NewPG(t), testenv.NewPG(t)}
	l, err := pgxstore.NewListener(withApplicationName(t, pgs[0].URL, testenv.UniqueName(t, "listen")), pgxstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close) // after the forwarders have stopped: cleanups run last in, first out
	var (
		stores []*pgxstore.Store
		recs   []recorder
	)
	for _, pg := range pgs {
		s, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), Listener: l})
		if err != nil {
			t.Fatal(err)
		}
		rec := recorder{sent: make(chan string, 10)}
		f, err := forwarder.New(forwarder.Config{Store: s, Publisher: rec, PollInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		storetest.RunForwarder(t, f) // returns once it listens
		stores, recs = append(stores, s), append(recs, rec)
	}
	for range 3 {
		for i := range pgs {
			msg := publish(t, pgs[i], stores[i], "k", 1)[0]
			expectPublished(t, recs[i], msg.UUID, 5*time.Second, "the relay was not woken through the shared listener")
		}
	}
}

// Closing the listener closes its connection and tells the relays still listening; a relay that
// starts listening afterwards is told at once. No goroutine outlives Close (TestMain's goleak).
func TestListenerCloseStopsItAndTellsTheRelays(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	name := testenv.UniqueName(t, "listen")
	l, err := pgxstore.NewListener(withApplicationName(t, pg.URL, name), pgxstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	r := listenThrough(t, s)
	testenv.Eventually(t, 10*time.Second, "the relay to be listening", func() bool { return r.listening.Load() == 1 })
	l.Close()
	l.Close()
	if errs := r.loggedErrors(); len(errs) != 1 || !errors.Is(errs[0], pgxstore.ErrListenerClosed) {
		t.Fatalf("the relay was told %v, want ErrListenerClosed once", errs)
	}
	testenv.Eventually(t, 10*time.Second, "the closed listener's backend to end", func() bool { return backends(t, pg, name) == 0 })
	late := listenThrough(t, s)
	testenv.Eventually(t, 5*time.Second, "a relay listening through a closed listener to be told", func() bool {
		errs := late.loggedErrors()
		return len(errs) == 1 && errors.Is(errs[0], pgxstore.ErrListenerClosed)
	})
}

// A store opened by URL (database/sql) listens through a shared Listener given in OpenOptions.
func TestOpenWithASharedListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.NewPG(t)
	name := testenv.UniqueName(t, "listen")
	l, err := pgxstore.NewListener(withApplicationName(t, pg.URL, name), pgxstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	db, err := store.Open(ctx, pg.URL, store.OpenOptions{Schema: string(pg.Schema), Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	r := listenThrough(t, db)
	testenv.Eventually(t, 10*time.Second, "the relay to be listening", func() bool { return r.listening.Load() == 1 })
	woken := r.wakes.Load()
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("events", message.NewMessage("0191e3a0-7c1d-7b2e-9f00-0000000000aa", []byte("{}"))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the commit to wake the relay", func() bool { return r.wakes.Load() > woken })
	if n := backends(t, pg, name); n != 1 {
		t.Fatalf("%d backends named %s, want 1", n, name)
	}
	if n := backends(t, pg, name+"-listen"); n != 0 {
		t.Fatalf("the store opened a LISTEN connection of its own beside the shared one")
	}
}

// A shared listener with a poll-only store, or beside a LISTEN URL, or for a database without
// NOTIFY, is refused at once.
func TestSharedListenerMisuseIsRefused(t *testing.T) {
	t.Parallel()
	l, err := pgxstore.NewListener("postgres://nobody@127.0.0.1:1/none", pgxstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := pgxstore.NewListener("postgres://x@127.0.0.1/db", pgxstore.ListenerConfig{Retry: -time.Second}); err == nil {
		t.Fatal("a negative retry was accepted")
	}
	if _, err := pgxstore.NewListener("postgres://x@[bad", pgxstore.ListenerConfig{}); err == nil {
		t.Fatal("a malformed connection string was accepted")
	}
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // connects on first use
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pgxstore.New(pool, pgxstore.Config{Listener: l, PollOnly: true}); err == nil || !strings.Contains(err.Error(), "PollOnly") {
		t.Fatalf("pgxstore.New with a Listener and PollOnly: %v, want refused", err)
	}
	sqlDB, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sqlDB.Close() }()
	if _, err := pgsqlstore.New(sqlDB, pgsqlstore.Config{Listener: l, ListenURL: "postgres://nobody@127.0.0.1:1/none"}); err == nil ||
		!strings.Contains(err.Error(), "ListenURL") {
		t.Fatalf("pgsqlstore.New with a Listener and a ListenURL: %v, want refused", err)
	}
	for _, c := range []struct {
		url  string
		opts store.OpenOptions
		want string
	}{
		{"postgres://nobody@127.0.0.1:1/none", store.OpenOptions{Listener: l, PollOnly: true}, "PollOnly"},
		{"mysql://root@127.0.0.1:1/none", store.OpenOptions{Listener: l}, "do not apply"},
		{"sqlite://" + t.TempDir() + "/x.db", store.OpenOptions{Listener: l}, "do not apply"},
	} {
		if _, err := store.Open(context.Background(), c.url, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Open %s with %+v: %v, want an error saying %q", c.url, c.opts, err, c.want)
		}
	}
}
