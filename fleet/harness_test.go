package fleet_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const topic = "events"

// published is one message as the fleet's publisher saw it: its stamps, and when its publish
// began and ended.
type published struct {
	uuid, tenant, outbox, member string
	token                        int64
	start, end                   time.Time
}

// recorder is the fleet's publisher in the tests: it records each publish and hands it on to a
// gochannel, whose subscriber collects what arrives.
type recorder struct {
	inner *gochannel.GoChannel
	mu    sync.Mutex
	sent  []published
	got   map[string]bool // UUIDs the subscriber received
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{inner: gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, nil), got: map[string]bool{}}
	msgs, err := r.inner.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range msgs {
			r.mu.Lock()
			r.got[msg.UUID] = true
			r.mu.Unlock()
			msg.Ack()
		}
	}()
	t.Cleanup(func() {
		_ = r.inner.Close()
		<-done
	})
	return r
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	start := time.Now()
	err := r.inner.Publish(topic, msgs...)
	end := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		token, _ := strconv.ParseInt(m.Metadata.Get(outboxkit.MetadataLeaseToken), 10, 64)
		r.sent = append(r.sent, published{uuid: m.UUID, tenant: m.Metadata.Get(outboxkit.MetadataTenant),
			outbox: m.Metadata.Get(outboxkit.MetadataOutbox), member: m.Metadata.Get(outboxkit.MetadataRelayMember),
			token: token, start: start, end: end})
	}
	return err
}

func (r *recorder) Close() error { return nil }

func (r *recorder) received(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[id]
}

func (r *recorder) publishes() []published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

// checkFencing fails the test where two owners of one outbox published at once: for each outbox,
// every publish under a token ended before the first publish under any higher token began.
func (r *recorder) checkFencing(t *testing.T) {
	t.Helper()
	type span struct{ first, last time.Time }
	spans := map[string]map[int64]*span{}
	for _, p := range r.publishes() {
		if spans[p.outbox] == nil {
			spans[p.outbox] = map[int64]*span{}
		}
		s := spans[p.outbox][p.token]
		if s == nil {
			s = &span{first: p.start, last: p.end}
			spans[p.outbox][p.token] = s
		}
		if p.start.Before(s.first) {
			s.first = p.start
		}
		if p.end.After(s.last) {
			s.last = p.end
		}
	}
	for outbox, byToken := range spans {
		tokens := make([]int64, 0, len(byToken))
		for tok := range byToken {
			tokens = append(tokens, tok)
		}
		slices.Sort(tokens)
		for i, lo := range tokens {
			for _, hi := range tokens[i+1:] {
				if byToken[lo].last.After(byToken[hi].first) {
					t.Errorf("outbox %s: token %d published until %s, after token %d began at %s: two owners at once",
						outbox, lo, byToken[lo].last.Format("15:04:05.000"), hi, byToken[hi].first.Format("15:04:05.000"))
				}
			}
		}
	}
}

// gated is a member's view of the coordination database that the test can cut off: while hung,
// every call waits until its context ends.
type gated struct {
	store.Store
	fc   store.FleetControl
	hung atomic.Bool
	// leaveFailures is how many LeaveFleet calls fail as on a session the server terminated.
	leaveFailures atomic.Int32
}

func gate(t *testing.T, s store.Store) *gated {
	t.Helper()
	fc, ok := store.FleetControlOf(s)
	if !ok {
		t.Fatalf("%s keeps no fleet", s.Info().Name)
	}
	return &gated{Store: s, fc: fc}
}

func (g *gated) wait(ctx context.Context) error {
	if g.hung.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (g *gated) FleetHeartbeat(ctx context.Context, f string, m store.FleetMember, ttl time.Duration) (time.Time, error) {
	if err := g.wait(ctx); err != nil {
		return time.Time{}, err
	}
	return g.fc.FleetHeartbeat(ctx, f, m, ttl)
}

func (g *gated) FleetMembers(ctx context.Context, f string) ([]store.FleetMember, time.Time, error) {
	if err := g.wait(ctx); err != nil {
		return nil, time.Time{}, err
	}
	return g.fc.FleetMembers(ctx, f)
}

func (g *gated) LeaveFleet(ctx context.Context, f, member string) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	if g.leaveFailures.Add(-1) >= 0 {
		return outboxkit.Unreachable(errors.New("FATAL: terminating connection due to administrator command (SQLSTATE 57P01)"))
	}
	return g.fc.LeaveFleet(ctx, f, member)
}

func (g *gated) AcquireLease(ctx context.Context, f, outbox, member string, ttl time.Duration) (store.Lease, bool, error) {
	if err := g.wait(ctx); err != nil {
		return store.Lease{}, false, err
	}
	return g.fc.AcquireLease(ctx, f, outbox, member, ttl)
}

func (g *gated) RenewLeases(ctx context.Context, f, member string, held []store.Lease, ttl time.Duration) ([]store.Lease, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return g.fc.RenewLeases(ctx, f, member, held, ttl)
}

func (g *gated) ReleaseLease(ctx context.Context, f, outbox, member string, token int64) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.fc.ReleaseLease(ctx, f, outbox, member, token)
}

func (g *gated) FleetLeases(ctx context.Context, f string) ([]store.Lease, time.Time, error) {
	if err := g.wait(ctx); err != nil {
		return nil, time.Time{}, err
	}
	return g.fc.FleetLeases(ctx, f)
}

func (g *gated) RecordFleetOutboxes(ctx context.Context, f, member string, o []store.FleetOutbox, forget time.Duration) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.fc.RecordFleetOutboxes(ctx, f, member, o, forget)
}

func (g *gated) FleetOutboxes(ctx context.Context, f string) ([]store.FleetOutbox, time.Time, error) {
	if err := g.wait(ctx); err != nil {
		return nil, time.Time{}, err
	}
	return g.fc.FleetOutboxes(ctx, f)
}

// catalog is a catalog the test changes while the fleet runs, or makes fail.
type catalog struct {
	mu       sync.Mutex
	outboxes []fleet.Outbox
	failing  bool
	failed   int // reads that failed
}

func (c *catalog) Outboxes(context.Context) ([]fleet.Outbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing {
		c.failed++
		return nil, errors.New("the catalog's database is down")
	}
	return slices.Clone(c.outboxes), nil
}

func (c *catalog) fail(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failing = on
}

func (c *catalog) failures() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *catalog) set(f func([]fleet.Outbox) []fleet.Outbox) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outboxes = f(c.outboxes)
}

// writer writes events into one outbox, as its application would.
type writer struct {
	st store.Driver[*sql.Tx]
	db *sql.DB
}

// write writes n events in one transaction and returns their UUIDs.
func (w writer) write(t *testing.T, n int) []string {
	t.Helper()
	ids, err := w.tryWrite(n)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (w writer) tryWrite(n int) ([]string, error) {
	ctx := context.Background()
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	pub, err := pipeline.NewPublisher(w.st, tx, pipeline.PublisherConfig{})
	if err != nil {
		return nil, err
	}
	ids := make([]string, n)
	for i := range ids {
		msg := pipeline.NewEvent("Happened", fmt.Sprintf("k-%d", i%3), []byte(`{}`))
		msg.UUID = uuid.NewString()
		ids[i] = msg.UUID
		if err := pub.Publish(topic, msg); err != nil {
			return nil, err
		}
	}
	return ids, tx.Commit()
}

// sqliteOutbox makes a migrated SQLite outbox in dir, and its writer.
func sqliteOutbox(t *testing.T, dir, name string) (fleet.Outbox, writer) {
	t.Helper()
	path := filepath.Join(dir, name+".db")
	st := openSQLite(t, path)
	if _, err := pipeline.Migrate(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return fleet.Outbox{Name: name, Tenant: "tenant-of-" + name, URL: "sqlite://" + path}, writer{st: st, db: st.DB()}
}

// sqliteCoordination is a migrated SQLite coordination database.
func sqliteCoordination(t *testing.T, dir string) store.Store {
	t.Helper()
	st := openSQLite(t, filepath.Join(dir, "coordination.db"))
	if _, err := pipeline.Migrate(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st
}

// openSQLite opens a SQLite database, closed when the test ends.
func openSQLite(t *testing.T, path string) *sqlitestore.Store {
	t.Helper()
	st, err := sqlitestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.DB().Close() })
	return st
}

// timing is the fleet's timing in the tests: a lease of 2s, a tick of 100ms.
func timing(cfg fleet.Config) fleet.Config {
	cfg.LeaseTTL, cfg.RenewInterval, cfg.StopBefore, cfg.Tick = 2*time.Second, 400*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
	if cfg.Forwarder.PollInterval == 0 {
		cfg.Forwarder.PollInterval, cfg.Forwarder.IdlePollInterval = 20*time.Millisecond, 200*time.Millisecond
	}
	return cfg
}

// running is a member the test started.
type running struct {
	*fleet.Member
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs a member until the test ends or stop.
func start(t *testing.T, cfg fleet.Config) *running {
	t.Helper()
	if cfg.Open == nil {
		cfg.Open = fleetstores.Opener()
	}
	m, err := fleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Member: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("member %s: Run: %v", m.Name(), err)
		}
	})
	return r
}

// stop ends the member's Run and returns what it returned.
func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(20 * time.Second):
			r.err = fmt.Errorf("member %s: Run did not return within 20s of its context's end", r.Name())
		}
	})
	return r.err
}

// owners maps each outbox to the members that relay it now.
func owners(members ...*running) map[string][]string {
	out := map[string][]string{}
	for _, m := range members {
		for _, o := range m.Owned() {
			out[o] = append(out[o], m.Name())
		}
	}
	return out
}

// ownedOnce reports whether each of names is relayed by exactly one of members, and nothing else is.
func ownedOnce(names []string, members ...*running) bool {
	own := owners(members...)
	if len(own) != len(names) {
		return false
	}
	for _, n := range names {
		if len(own[n]) != 1 {
			return false
		}
	}
	return true
}

func describe(own map[string][]string) string {
	keys := make([]string, 0, len(own))
	for k := range own {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s:%v ", k, own[k])
	}
	return b.String()
}

// waitReceived waits until every id has reached the broker.
func waitReceived(t *testing.T, pub *recorder, ids []string, within time.Duration) {
	t.Helper()
	var missing int
	if !testenv.Within(within, func() bool {
		missing = 0
		for _, id := range ids {
			if !pub.received(id) {
				missing++
			}
		}
		return missing == 0
	}) {
		t.Fatalf("%d of %d events did not reach the broker within %s", missing, len(ids), within)
	}
}

// leaseEvents counts what a member's Metrics hear.
type leaseEvents struct {
	mu                       sync.Mutex
	acquired, released, lost map[string]int
	reasons                  []string
	failed                   map[string]int
}

func newLeaseEvents() *leaseEvents {
	return &leaseEvents{acquired: map[string]int{}, released: map[string]int{}, lost: map[string]int{}, failed: map[string]int{}}
}

func (e *leaseEvents) LeaseAcquired(outbox string, _ int64) { e.inc(e.acquired, outbox) }
func (e *leaseEvents) LeaseReleased(outbox string)          { e.inc(e.released, outbox) }
func (e *leaseEvents) RelayFailed(outbox string, _ error)   { e.inc(e.failed, outbox) }
func (e *leaseEvents) LeaseLost(outbox, reason string) {
	e.mu.Lock()
	e.reasons = append(e.reasons, reason)
	e.mu.Unlock()
	e.inc(e.lost, outbox)
}

func (e *leaseEvents) inc(m map[string]int, outbox string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m[outbox]++
}

func (e *leaseEvents) count(m map[string]int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
