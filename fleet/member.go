package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// Member is one relay process of a fleet: it heartbeats in the coordination database, acquires
// the leases of the outboxes that rendezvous hashing gives it among the live members, relays each
// with a forwarder of its own, and hands an outbox over when a member it prefers joins.
//
// Each owner stamps every message it publishes with the outbox's tenant, its name, the lease's
// fencing token and its own name (outboxkit.MetadataTenant, MetadataOutbox, MetadataLeaseToken,
// MetadataRelayMember), and stops publishing StopBefore before its lease could expire when no
// renewal succeeded: a member cut off from the coordination database stops its relays before
// another member can acquire them.
//
// Its methods are safe for concurrent use.
type Member struct {
	cfg     Config
	fc      store.FleetControl
	epoch   time.Time // since() is measured from it, on the monotonic clock
	started time.Time
	host    string

	running atomic.Bool
	relays  sync.WaitGroup // every relay's goroutine

	mu       sync.Mutex
	owned    map[string]*relay // the outboxes with a relay, running or stopping
	dbOffset time.Duration     // the coordination database's clock less the member's, at the last heartbeat

	// The manager's own state: read and written by the goroutine that runs ticks alone.
	tickN     int
	catalog   []Outbox         // the last good catalog: valid outboxes, by name
	invalid   map[string]error // its outboxes that are not valid
	loaded    bool             // a catalog was read
	changed   bool             // the catalog changed since it was last recorded
	seen      map[string]int   // member → consecutive ticks it was seen live
	unowned   map[string]int   // outbox → consecutive ticks it was seen without an owner
	fallbacks map[string]int   // outbox → times in a row this member took it by fallback
	recorded  map[string]int   // outbox → the relay's statsSeq last recorded
}

// New validates cfg, fills in the defaults and builds a Member. It does not touch any database.
func New(cfg Config) (*Member, error) {
	cfg = cfg.withDefaults()
	fc, err := cfg.validate()
	if err == nil {
		err = checkForwarderTemplate(cfg.Forwarder)
	}
	if err != nil {
		return nil, fmt.Errorf("fleet config: %w", err)
	}
	host, _ := os.Hostname()
	return &Member{cfg: cfg, fc: fc, epoch: time.Now(), started: time.Now(), host: host}, nil
}

// checkForwarderTemplate refuses a forwarder configuration that no outbox could use, at start,
// with the forwarder's own words.
func checkForwarderTemplate(t forwarder.Config) error {
	t.Store, t.Publisher, t.Metrics = placeholderStore{}, placeholderPublisher{}, nil
	if _, err := forwarder.New(t); err != nil {
		return fmt.Errorf("field Forwarder: %w", err)
	}
	return nil
}

// Name is the member's name in the fleet.
func (m *Member) Name() string { return m.cfg.Member }

// Owned lists, by name, the outboxes the member relays now.
func (m *Member) Owned() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name, r := range m.owned {
		if !r.stopping() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Status reads the fleet's status from the coordination database (ReadStatus).
func (m *Member) Status(ctx context.Context) (Status, error) {
	return ReadStatus(ctx, m.fc, m.cfg.Fleet)
}

// since is the time since the member was built, on the monotonic clock: lease deadlines are
// measured on it, never on the wall clock.
func (m *Member) since() time.Duration { return time.Since(m.epoch) }

func (m *Member) fields() watermill.LogFields {
	return watermill.LogFields{"fleet": m.cfg.Fleet, "member": m.cfg.Member}
}

// callTimeout bounds each call to the coordination database: half the time a lease lets a
// relay publish after its last renewal, so that a call that hangs leaves room for another.
func (m *Member) callTimeout() time.Duration {
	return max(m.cfg.RenewInterval, (m.cfg.LeaseTTL-m.cfg.StopBefore)/2)
}

// statsInterval is how often an owner reads an outbox's backlog.
func (m *Member) statsInterval() time.Duration { return 5 * m.cfg.Tick }

var errAlreadyRunning = errors.New("fleet: Run is already running on this Member")

// Run makes the member a member of the fleet until ctx ends, then stops every relay, leaves the
// fleet (freeing its leases, so the other members take its outboxes at their next tick) and
// returns nil once every goroutine it started has stopped.
//
// An unreachable coordination database, catalog or outbox never ends it: it logs and retries,
// keeping the last catalog it read, and its relays stop while it cannot renew their leases. It
// returns an error at once for what no retry mends: a coordination database not migrated
// (pipeline.Migrate creates the fleet's tables), or a first catalog that is not usable
// (ErrCatalog). Run may not run twice at once on one Member.
func (m *Member) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer m.running.Store(false)
	m.mu.Lock()
	m.owned = map[string]*relay{}
	m.mu.Unlock()
	m.tickN, m.catalog, m.invalid, m.loaded = 0, nil, nil, false
	m.seen, m.unowned, m.fallbacks, m.recorded = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}

	joined, err := m.join(ctx)
	if joined {
		renewCtx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
		renewed := make(chan struct{})
		go func() {
			defer close(renewed)
			m.renewLoop(renewCtx)
		}()
		err = m.manage(ctx)
		// The relays stop first, while their leases are still renewed; then the renewals.
		m.stopAll("the member is stopping")
		m.relays.Wait()
		stopRenewing()
		<-renewed
	}
	if !joined {
		return err
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if lerr := m.leave(lctx); lerr != nil {
		logs.Warn(m.cfg.Logger, "Cannot leave the fleet; its leases expire by themselves", lerr, m.fields())
	} else {
		m.cfg.Logger.Info("Left the fleet", m.fields())
	}
	return err
}

// join waits until the member's first heartbeat lands, and until no other live member has its
// name; joined is false when ctx ended first, or on an error, which is returned only for what no
// retry mends.
func (m *Member) join(ctx context.Context) (joined bool, err error) {
	for attempt := 1; ; attempt++ {
		err := m.checkName(ctx)
		if err == nil {
			err = m.heartbeat(ctx)
		}
		switch {
		case err == nil:
			m.cfg.Logger.Info("Joined the fleet", m.fields())
			return true, nil
		case ctx.Err() != nil:
			return false, nil
		case errors.Is(err, store.ErrNotMigrated) || errors.Is(err, store.ErrNewerSchema) || outboxkit.IsAccessDenied(err):
			return false, fmt.Errorf("fleet %s: coordination database: %w", m.cfg.Fleet, err)
		}
		m.cfg.Logger.Error("Cannot join the fleet; retrying", err, m.fields())
		select {
		case <-ctx.Done():
			return false, nil
		case <-time.After(min(m.cfg.RenewInterval*time.Duration(attempt), 30*time.Second)):
		}
	}
}

// checkName refuses to join while a live member of the same name runs elsewhere (another host or
// process): two processes with one name would both believe they hold its leases.
func (m *Member) checkName(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	members, now, err := m.fc.FleetMembers(cctx, m.cfg.Fleet)
	if err != nil {
		return fmt.Errorf("read the fleet's members: %w", err)
	}
	for _, other := range members {
		if other.Name == m.cfg.Member && now.Before(other.ExpiresAt) && (other.Host != m.host || other.PID != os.Getpid()) {
			return fmt.Errorf("a live member named %q runs on %s (pid %d): give each member its own name (Config.Member), "+
				"or wait for its heartbeat to expire", m.cfg.Member, other.Host, other.PID)
		}
	}
	return nil
}

func (m *Member) heartbeat(ctx context.Context) error {
	m.mu.Lock()
	owned := 0
	for _, r := range m.owned {
		if !r.stopping() {
			owned++
		}
	}
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	now, err := m.fc.FleetHeartbeat(cctx, m.cfg.Fleet, store.FleetMember{
		Name: m.cfg.Member, Host: m.host, PID: os.Getpid(), Started: m.started, Owned: owned,
	}, m.cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	m.mu.Lock()
	m.dbOffset = time.Until(now)
	m.mu.Unlock()
	return nil
}

// renewLoop heartbeats and renews the member's leases every RenewInterval until ctx ends.
func (m *Member) renewLoop(ctx context.Context) {
	ticker := time.NewTicker(m.cfg.RenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if err := m.heartbeat(ctx); err != nil && ctx.Err() == nil {
			logs.Warn(m.cfg.Logger, "Fleet heartbeat failed; retrying", err, m.fields())
		}
		m.renew(ctx)
	}
}

// renew renews every lease the member holds. A lease renewed moves its relay's deadline; a lease
// the coordination database no longer gives the member stops its relay at once; a failure moves
// nothing, and each relay stops at its deadline unless a later renewal succeeds.
func (m *Member) renew(ctx context.Context) {
	m.mu.Lock()
	var held []*relay
	for _, r := range m.owned {
		if !r.stopping() {
			held = append(held, r)
		}
	}
	m.mu.Unlock()
	if len(held) == 0 {
		return
	}
	leases := make([]store.Lease, len(held))
	for i, r := range held {
		leases[i] = r.lease
	}
	sent := m.since()
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	renewed, err := m.fc.RenewLeases(cctx, m.cfg.Fleet, m.cfg.Member, leases, m.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			logs.Warn(m.cfg.Logger, "Cannot renew the member's leases; its relays stop unless a renewal succeeds in time", err,
				m.fields().Add(watermill.LogFields{"leases": len(leases)}))
		}
		return
	}
	still := make(map[string]int64, len(renewed))
	for _, l := range renewed {
		still[l.Outbox] = l.Token
	}
	for _, r := range held {
		if token, ok := still[r.outbox.Name]; ok && token == r.lease.Token {
			r.extend(sent + m.cfg.LeaseTTL - m.cfg.StopBefore)
			continue
		}
		m.cfg.Logger.Error("Lease lost: the outbox's relay stops at once", errLeaseLost, r.fields())
		m.cfg.Metrics.LeaseLost(r.outbox.Name, "taken by another member")
		r.stop("lease lost", false)
	}
}

var errLeaseLost = errors.New("the coordination database no longer gives the member this lease")

// manage runs a tick every Tick until ctx ends.
func (m *Member) manage(ctx context.Context) error {
	ticker := time.NewTicker(m.cfg.Tick)
	defer ticker.Stop()
	for {
		if err := m.tick(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// tick reads the catalog and the fleet, acquires and releases outboxes as they say, and records
// the catalog.
func (m *Member) tick(ctx context.Context) error {
	m.tickN++
	if err := m.loadCatalog(ctx); err != nil {
		return err
	}
	if !m.loaded {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	members, now, err := m.fc.FleetMembers(cctx, m.cfg.Fleet)
	if err == nil {
		var leases []store.Lease
		leases, _, err = m.fc.FleetLeases(cctx, m.cfg.Fleet)
		if err == nil {
			m.place(ctx, members, leases, now)
		}
	}
	if err != nil && ctx.Err() == nil {
		logs.Warn(m.cfg.Logger, "Cannot read the fleet; the member keeps what it relays", err, m.fields())
	}
	m.record(ctx)
	return nil
}

// loadCatalog reads the catalog. A catalog that cannot be read, or is not usable, leaves the last
// good one in force; the first one read that is not usable (ErrCatalog) ends Run.
func (m *Member) loadCatalog(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, max(5*m.cfg.Tick, 5*time.Second))
	defer cancel()
	list, err := m.cfg.Catalog.Outboxes(cctx)
	var valid []Outbox
	var invalid map[string]error
	if err == nil {
		valid, invalid, err = checkCatalog(list)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if !m.loaded && errors.Is(err, ErrCatalog) {
			return fmt.Errorf("fleet %s: %w", m.cfg.Fleet, err)
		}
		what := "Cannot read the catalog; the last one read stays in force"
		if !m.loaded {
			what = "Cannot read the catalog; nothing is relayed until it can be read"
		}
		m.cfg.Logger.Error(what, err, m.fields())
		return nil
	}
	for name, e := range invalid {
		if old, ok := m.invalid[name]; !ok || old.Error() != e.Error() {
			m.cfg.Logger.Error("Outbox of the catalog left out", e, m.fields())
		}
	}
	if !m.loaded || !slices.Equal(valid, m.catalog) || len(invalid) != len(m.invalid) {
		m.changed = true
	}
	m.catalog, m.invalid, m.loaded = valid, invalid, true
	return nil
}

// place acquires the outboxes the member should relay and hands over or stops those it should
// not, from the fleet as the coordination database told it at now.
func (m *Member) place(ctx context.Context, members []store.FleetMember, leases []store.Lease, now time.Time) {
	var live []string
	selfLive := false
	for _, mb := range members {
		if now.Before(mb.ExpiresAt) {
			live = append(live, mb.Name)
			selfLive = selfLive || mb.Name == m.cfg.Member
		}
	}
	if !selfLive {
		// Until its heartbeat lands the others do not count it: it must not take their share.
		live = append(live, m.cfg.Member)
	}
	seen := make(map[string]int, len(live))
	for _, name := range live {
		seen[name] = m.seen[name] + 1
	}
	m.seen = seen
	leaseOf := make(map[string]store.Lease, len(leases))
	for _, l := range leases {
		leaseOf[l.Outbox] = l
	}
	want := make(map[string]Outbox, len(m.catalog))
	var enabled []string
	for _, o := range m.catalog {
		if !o.Disabled {
			want[o.Name] = o
			enabled = append(enabled, o.Name)
		}
	}
	preferred := placement(enabled, live)

	m.mu.Lock()
	owned := make(map[string]*relay, len(m.owned))
	for name, r := range m.owned {
		owned[name] = r
	}
	m.mu.Unlock()

	for name, r := range owned {
		if r.stopping() {
			continue
		}
		o, ok := want[name]
		switch {
		case !ok:
			m.handOver(r, "disabled or removed from the catalog")
		case o != r.outbox:
			m.handOver(r, "changed in the catalog")
		default:
			pref := preferred[name]
			// A member that just appeared may be flapping: it must have been live a tick already.
			if pref != m.cfg.Member && m.seen[pref] >= 2 && (!r.fallback || m.tickN-r.acquiredTick >= r.hold) {
				m.handOver(r, "handed over to "+pref)
			}
		}
	}

	for name := range m.unowned {
		if _, ok := want[name]; !ok {
			delete(m.unowned, name)
			delete(m.fallbacks, name)
		}
	}
	var take []toAcquire
	for _, o := range m.catalog {
		if o.Disabled {
			continue
		}
		if _, ok := owned[o.Name]; ok {
			continue
		}
		pref := preferred[o.Name]
		l := leaseOf[o.Name]
		if l.Held(now) && l.Owner != m.cfg.Member {
			m.unowned[o.Name] = 0
			if l.Owner == pref {
				delete(m.fallbacks, o.Name)
			}
			continue
		}
		m.unowned[o.Name]++
		fallback := pref != m.cfg.Member
		// The preferred owner takes it at its next tick; if it has not within two, anyone may.
		if !selfLive || (fallback && m.unowned[o.Name] < 3) {
			continue
		}
		take = append(take, toAcquire{o: o, fallback: fallback})
	}
	m.acquireAll(ctx, take)
}

// toAcquire is an outbox a tick decided to take.
type toAcquire struct {
	o        Outbox
	fallback bool
	lease    store.Lease
	ok       bool
	sent     time.Duration
}

// acquireParallel bounds the lease requests a tick has in flight at once: after a member's death
// the others take its share (a hundred outboxes and more) in one tick, and one round trip after
// another would delay the last of them by seconds.
const acquireParallel = 8

// acquireAll asks for the leases of take, acquireParallel at a time, and starts the relay of each
// one granted, in take's order.
func (m *Member) acquireAll(ctx context.Context, take []toAcquire) {
	sem := make(chan struct{}, acquireParallel)
	var wg sync.WaitGroup
	for i := range take {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(a *toAcquire) {
			defer func() { <-sem; wg.Done() }()
			a.lease, a.ok, a.sent = m.requestLease(ctx, a.o)
		}(&take[i])
	}
	wg.Wait()
	for _, a := range take {
		if a.ok {
			m.start(ctx, a.o, a.lease, a.sent, a.fallback)
		}
	}
}

// handOver stops r's relay and, once it has stopped, releases its lease.
func (m *Member) handOver(r *relay, reason string) {
	m.cfg.Logger.Info("Releasing outbox: "+reason, r.fields())
	r.stop(reason, true)
}

// requestLease asks for o's lease; ok when it was free (or this member's) and is now this
// member's, sent being when the request left.
func (m *Member) requestLease(ctx context.Context, o Outbox) (l store.Lease, ok bool, sent time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	sent = m.since()
	l, ok, err := m.fc.AcquireLease(cctx, m.cfg.Fleet, o.Name, m.cfg.Member, m.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			logs.Warn(m.cfg.Logger, "Cannot acquire an outbox's lease; retrying at the next tick", err,
				m.fields().Add(watermill.LogFields{"outbox": o.Name}))
		}
		return l, false, sent
	}
	return l, ok, sent
}

// start starts the relay of o, whose lease l the member acquired by a request sent at sent.
func (m *Member) start(ctx context.Context, o Outbox, l store.Lease, sent time.Duration, fallback bool) {
	r := newRelay(m, o, l, sent+m.cfg.LeaseTTL-m.cfg.StopBefore)
	r.acquiredTick = m.tickN
	if fallback {
		m.fallbacks[o.Name]++
		r.fallback = true
		// Handed back to its preferred owner after 10 ticks, then 20, 40… while it does not take it.
		r.hold = 10 << min(m.fallbacks[o.Name]-1, 5)
	}
	m.unowned[o.Name] = 0
	m.mu.Lock()
	m.owned[o.Name] = r
	m.mu.Unlock()
	m.cfg.Logger.Info("Acquired outbox", r.fields().Add(watermill.LogFields{"fallback": fallback}))
	m.cfg.Metrics.LeaseAcquired(o.Name, l.Token)
	m.relays.Add(1)
	go r.run(context.WithoutCancel(ctx))
}

// ended is called by r's goroutine once its relay has stopped.
func (m *Member) ended(r *relay) {
	if r.release {
		ctx, cancel := context.WithTimeout(context.Background(), m.callTimeout())
		err := m.fc.ReleaseLease(ctx, m.cfg.Fleet, r.outbox.Name, m.cfg.Member, r.lease.Token)
		cancel()
		if err != nil {
			logs.Warn(m.cfg.Logger, "Cannot release an outbox's lease; it expires by itself", err, r.fields())
		} else {
			m.cfg.Metrics.LeaseReleased(r.outbox.Name)
			m.cfg.Logger.Info("Released outbox", r.fields())
		}
	}
	m.mu.Lock()
	if m.owned[r.outbox.Name] == r {
		delete(m.owned, r.outbox.Name)
	}
	m.mu.Unlock()
}

// stopAll stops every relay without releasing: LeaveFleet frees the leases.
func (m *Member) stopAll(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.owned {
		r.stop(reason, false)
	}
}

// record records the whole catalog in the coordination database, with the backlog of the
// outboxes the member relays: when the catalog changed, when a backlog reading is new, and every
// fifth tick regardless, so that the outboxes stay known.
func (m *Member) record(ctx context.Context) {
	m.mu.Lock()
	offset := m.dbOffset
	owned := make(map[string]*relay, len(m.owned))
	for name, r := range m.owned {
		owned[name] = r
	}
	m.mu.Unlock()
	nowDB := time.Now().Add(offset)
	list := make([]store.FleetOutbox, 0, len(m.catalog)+len(m.invalid))
	fresh := m.changed || m.tickN%5 == 1
	for _, o := range m.catalog {
		fo := store.FleetOutbox{Name: o.Name, Tenant: o.Tenant, Disabled: o.Disabled}
		if r, ok := owned[o.Name]; ok && !r.stopping() {
			if seq := r.record(&fo, m.recorded[o.Name], offset); seq != m.recorded[o.Name] {
				m.recorded[o.Name], fresh = seq, true
			}
		}
		list = append(list, fo)
	}
	for name, err := range m.invalid {
		if name != "" {
			list = append(list, store.FleetOutbox{Name: name, Tenant: name, Error: err.Error(), StatsAt: nowDB})
		}
	}
	for name := range m.recorded {
		if _, ok := owned[name]; !ok {
			delete(m.recorded, name)
		}
	}
	if !fresh {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout())
	defer cancel()
	if err := m.fc.RecordFleetOutboxes(cctx, m.cfg.Fleet, m.cfg.Member, list, forgetAfter); err != nil {
		if ctx.Err() == nil {
			logs.Warn(m.cfg.Logger, "Cannot record the catalog in the coordination database", err, m.fields())
		}
		return
	}
	m.changed = false
}

// forgetAfter: an outbox no member has recorded for this long leaves Status.
const forgetAfter = 10 * time.Minute

// forwarderConfig is the configuration of r's forwarder on s.
func (m *Member) forwarderConfig(r *relay, s store.Store) forwarder.Config {
	c := m.cfg.Forwarder
	c.Store, c.Name = s, r.outbox.Name
	c.Publisher = newStamper(m.cfg.Publisher, r.outbox, r.lease.Token, m.cfg.Member, r.allowed)
	if c.Logger == nil {
		c.Logger = m.cfg.Logger
	}
	if m.cfg.ForwarderMetrics != nil {
		c.Metrics = m.cfg.ForwarderMetrics(r.outbox.Name)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultRelayHeartbeat
	}
	if c.IdlePollInterval == 0 {
		poll := c.PollInterval
		c.IdlePollInterval = DefaultIdlePollWithoutWake
		if s.Waker() != nil && s.Info().Name != "sqlite" {
			c.IdlePollInterval = DefaultIdlePoll
		}
		if poll == 0 {
			poll = forwarder.DefaultPollInterval
			if s.Waker() == nil {
				poll = forwarder.DefaultPollIntervalWithoutWake
			}
		}
		c.IdlePollInterval = max(c.IdlePollInterval, poll)
	}
	return c
}

// leave releases the member's leases, trying again while the coordination database is
// unreachable, until ctx ends: a pool whose idle sessions the server terminated (a failover, an
// operator's pg_terminate_backend) hands out each of them once before it dials afresh, and a
// member that stops right after would otherwise leave its outboxes unowned for a lease's term.
func (m *Member) leave(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := m.fc.LeaveFleet(ctx, m.cfg.Fleet, m.cfg.Member)
		if err == nil || !m.cfg.Coordination.IsUnreachable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(time.Duration(attempt)*50*time.Millisecond, 500*time.Millisecond)):
		}
	}
}
