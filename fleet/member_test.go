package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// Three members share twelve outboxes, each relayed by exactly one; a member that leaves hands
// its outboxes to the others, a member that joins takes its share; every event reaches the
// broker, stamped with its tenant, its outbox and its owner's token, and never two owners of an
// outbox published at once.
func TestMember_MembersShareTheOutboxes(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	pub := newRecorder(t)
	var names []string
	outboxes := fleet.Outboxes{}
	writers := map[string]writer{}
	for i := range 12 {
		o, w := sqliteOutbox(t, dir, fmt.Sprintf("tenant-%02d", i))
		outboxes, writers[o.Name] = append(outboxes, o), w
		names = append(names, o.Name)
	}
	cfg := func(member string) fleet.Config {
		return timing(fleet.Config{Fleet: "share", Member: member, Coordination: coord, Catalog: outboxes, Publisher: pub})
	}
	m1, m2, m3 := start(t, cfg("m1")), start(t, cfg("m2")), start(t, cfg("m3"))
	all := []*running{m1, m2, m3}
	waitSpread(t, names, 2, all...)

	var ids []string
	write := func() {
		for _, n := range names {
			ids = append(ids, writers[n].write(t, 5)...)
		}
	}
	write()
	waitReceived(t, pub, ids, 10*time.Second)

	waitStatus(t, m1, "3 live members relaying 12 outboxes", func(st fleet.Status) bool {
		return st.LiveMembers() == 3 && len(st.Outboxes) == 12 && len(st.Unowned()) == 0
	})

	// m3 leaves: its outboxes go to m1 and m2.
	gone := m3.Owned()
	if err := m3.stop(); err != nil {
		t.Fatal(err)
	}
	waitOwnedOnce(t, names, m1, m2)
	write()

	// m4 joins: it takes its share.
	m4 := start(t, cfg("m4"))
	waitSpread(t, names, 2, m1, m2, m4)
	write()
	waitReceived(t, pub, ids, 10*time.Second)
	t.Logf("m3 held %v; now %s", gone, describe(owners(m1, m2, m4)))

	tokens := map[string]map[int64]bool{}
	for _, p := range pub.publishes() {
		if p.tenant != "tenant-of-"+p.outbox || !slices.Contains(names, p.outbox) || p.token < 1 ||
			!slices.Contains([]string{"m1", "m2", "m3", "m4"}, p.member) {
			t.Fatalf("message %s stamped tenant %q, outbox %q, token %d, member %q", p.uuid, p.tenant, p.outbox, p.token, p.member)
		}
		if tokens[p.outbox] == nil {
			tokens[p.outbox] = map[int64]bool{}
		}
		tokens[p.outbox][p.token] = true
	}
	pub.checkFencing(t)
}

// waitOwnedOnce waits until each outbox is relayed by exactly one of members.
func waitOwnedOnce(t *testing.T, names []string, members ...*running) {
	t.Helper()
	waitSpread(t, names, 0, members...)
}

// waitSpread waits until each outbox is relayed by exactly one of members, and each member
// relays at least least of them.
func waitSpread(t *testing.T, names []string, least int, members ...*running) {
	t.Helper()
	if !testenv.Within(10*time.Second, func() bool {
		if !ownedOnce(names, members...) {
			return false
		}
		for _, m := range members {
			if len(m.Owned()) < least {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("after 10s the outboxes are not owned once each, at least %d a member: %s", least, describe(owners(members...)))
	}
}

// A member cut off from the coordination database stops publishing before its leases can
// expire, so another member that acquires them never publishes beside it.
func TestMember_StopsRelayingBeforeItsLeaseCanBeTaken(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	pub := newRecorder(t)
	var names []string
	outboxes := fleet.Outboxes{}
	writers := map[string]writer{}
	for i := range 4 {
		o, w := sqliteOutbox(t, dir, fmt.Sprintf("fenced-%d", i))
		outboxes, writers[o.Name] = append(outboxes, o), w
		names = append(names, o.Name)
	}
	cut := gate(t, coord)
	cfg := func(member string, c fleet.Config) fleet.Config {
		c.Fleet, c.Member, c.Catalog, c.Publisher = "fence", member, outboxes, pub
		return timing(c)
	}
	events := newLeaseEvents()
	m1 := start(t, cfg("m1", fleet.Config{Coordination: cut, Metrics: events}))
	m2 := start(t, cfg("m2", fleet.Config{Coordination: coord}))
	waitSpread(t, names, 1, m1, m2)
	held := m1.Owned()
	if len(held) == 0 {
		t.Fatalf("m1 relays nothing: %s", describe(owners(m1, m2)))
	}

	// Events keep coming into every outbox while m1 is cut off.
	ctx, stopWriting := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				got, err := writers[n].tryWrite(1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, got...)
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
	}
	cutAt := time.Now()
	cut.hung.Store(true)
	waitOwnedOnce(t, names, m2)
	t.Logf("m2 relays all %d outboxes %s after m1 was cut off (lease %s)", len(names), time.Since(cutAt).Round(time.Millisecond), 2*time.Second)
	if len(m1.Owned()) != 0 {
		t.Errorf("m1 still relays %v", m1.Owned())
	}
	if n := events.count(events.lost); n != len(held) || !slices.Contains(events.reasons, "not renewed in time") {
		t.Errorf("m1's metrics heard %d leases lost (%v), want %d, not renewed in time", n, events.reasons, len(held))
	}
	// m1 comes back: it takes its share again, from m2, which stops first.
	cut.hung.Store(false)
	waitSpread(t, names, 1, m1, m2)
	stopWriting()
	wg.Wait()
	waitReceived(t, pub, ids, 10*time.Second)
	pub.checkFencing(t)

	// The lease taken from m1 has a higher token, and m2's messages carry it.
	last := map[string]map[string]int64{}
	for _, p := range pub.publishes() {
		if last[p.outbox] == nil {
			last[p.outbox] = map[string]int64{}
		}
		last[p.outbox][p.member] = max(last[p.outbox][p.member], p.token)
	}
	for _, n := range held {
		if last[n]["m2"] == 0 {
			t.Errorf("outbox %s: m2 never published it after m1 was cut off", n)
		}
	}
}

// Outboxes added to the catalog while the fleet runs are relayed within a tick or two; disabled
// ones stop; one that cannot be opened, or is not valid, shows its error in Status and holds back
// no other.
func TestMember_FollowsTheCatalog(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	pub := newRecorder(t)
	first, w := sqliteOutbox(t, dir, "first")
	cat := &catalog{outboxes: []fleet.Outbox{first,
		{Name: "broken", URL: "sqlite://"},                             // cannot be opened
		{Name: "invalid", URL: "sqlite://x.db", Relay: fleet.RelayLog}, // not valid: the log relay is Postgres's
	}}
	// The forwarder's defaults: the figure measured is the one a fleet gets.
	cfg := func(member string) fleet.Config {
		c := timing(fleet.Config{Fleet: "catalog", Member: member, Coordination: coord, Catalog: cat, Publisher: pub})
		c.Forwarder.PollInterval, c.Forwarder.IdlePollInterval, c.Tick = 0, 0, time.Second
		return c
	}
	m1, m2 := start(t, cfg("m1")), start(t, cfg("m2"))
	ids := w.write(t, 3)
	waitReceived(t, pub, ids, 10*time.Second)

	late, lw := sqliteOutbox(t, dir, "late")
	ids = lw.write(t, 1)
	added := time.Now()
	cat.set(func(o []fleet.Outbox) []fleet.Outbox { return append(o, late) })
	waitReceived(t, pub, ids, 10*time.Second)
	took := time.Since(added)
	t.Logf("an outbox added to the catalog had its first event relayed %s later (tick 1s)", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("first event of a new outbox relayed after %s, want within 5s", took)
	}

	// The catalog cannot be read for a while: the last one read stays in force.
	waitOwnedOnce(t, []string{"broken", "first", "late"}, m1, m2)
	relayed := append(m1.Owned(), m2.Owned()...)
	slices.Sort(relayed)
	cat.fail(true)
	testenv.Eventually(t, 10*time.Second, "3 failed reads of the catalog", func() bool { return cat.failures() >= 3 })
	still := append(m1.Owned(), m2.Owned()...)
	slices.Sort(still)
	if !slices.Equal(still, relayed) {
		t.Errorf("while the catalog could not be read the fleet went from relaying %v to %v", relayed, still)
	}
	cat.fail(false)

	st := waitStatus(t, m1, "the broken and invalid outboxes' errors", func(st fleet.Status) bool {
		return errorOf(st, "broken") != "" && errorOf(st, "invalid") != ""
	})
	for _, n := range []string{"broken", "invalid"} {
		t.Logf("status of %s: %s", n, errorOf(st, n))
	}
	if !strings.Contains(errorOf(st, "invalid"), "Postgres") {
		t.Errorf("invalid outbox: error %q, want it to say the log relay needs Postgres", errorOf(st, "invalid"))
	}

	cat.set(func(o []fleet.Outbox) []fleet.Outbox {
		for i := range o {
			if o[i].Name == "late" {
				o[i].Disabled = true
			}
		}
		return o
	})
	testenv.Eventually(t, 10*time.Second, "the disabled outbox to stop", func() bool {
		return !slices.Contains(append(m1.Owned(), m2.Owned()...), "late")
	})
	waitStatus(t, m1, "the disabled outbox released", func(st fleet.Status) bool {
		for _, o := range st.Outboxes {
			if o.Name == "late" {
				return o.Disabled && o.Owner == "" && !o.Unowned()
			}
		}
		return false
	})
	// Disabling one outbox may move another (each member's share changes): after its handover,
	// first is relayed again.
	if !testenv.Within(10*time.Second, func() bool { return slices.Contains(append(m1.Owned(), m2.Owned()...), "first") }) {
		t.Errorf("outbox first is relayed by nobody: %s", describe(owners(m1, m2)))
	}
}

func errorOf(st fleet.Status, outbox string) string {
	for _, o := range st.Outboxes {
		if o.Name == outbox {
			return o.Error
		}
	}
	return ""
}

func waitStatus(t *testing.T, m *running, what string, cond func(fleet.Status) bool) fleet.Status {
	t.Helper()
	var st fleet.Status
	var err error
	if !testenv.Within(10*time.Second, func() bool {
		st, err = m.Status(context.Background())
		return err == nil && cond(st)
	}) {
		t.Fatalf("timed out waiting for %s: status %+v, %v", what, st, err)
	}
	return st
}

// An outbox placed on a member that does not take it — its catalog is behind, say — is taken by
// another within a few ticks: a member that is up but stuck leaves nothing unowned.
func TestMember_TakesWhatThePreferredMemberDoesNotTake(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	pub := newRecorder(t)
	a, _ := sqliteOutbox(t, dir, "a")
	b, _ := sqliteOutbox(t, dir, "b")
	// Two outboxes, two members: one of them is placed on m2, whose catalog is empty.
	m1 := start(t, timing(fleet.Config{Fleet: "stuck", Member: "m1", Coordination: coord, Catalog: fleet.Outboxes{a, b}, Publisher: pub}))
	m2 := start(t, timing(fleet.Config{Fleet: "stuck", Member: "m2", Coordination: coord, Catalog: fleet.Outboxes{}, Publisher: pub}))
	testenv.Eventually(t, 10*time.Second, "m2 live in m1's view", func() bool {
		st, err := m1.Status(context.Background())
		return err == nil && st.LiveMembers() == 2
	})
	waitSpread(t, []string{"a", "b"}, 0, m1, m2)
	if len(m2.Owned()) != 0 {
		t.Fatalf("m2 relays %v with an empty catalog", m2.Owned())
	}
}

// A member that stops right after the server terminated its pool's idle sessions still releases
// its leases: each terminated session fails one call, and the member tries again, not once.
func TestMember_LeavesTheFleetThroughTerminatedSessions(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	o, _ := sqliteOutbox(t, dir, "left")
	cut := gate(t, coord)
	m := start(t, timing(fleet.Config{Coordination: cut, Fleet: "leave", Member: "m1", Catalog: fleet.Outboxes{o}, Publisher: newRecorder(t)}))
	waitOwnedOnce(t, []string{o.Name}, m)
	cut.leaveFailures.Store(3)
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	fc, _ := store.FleetControlOf(coord)
	leases, now, err := fc.FleetLeases(context.Background(), "leave")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Held(now) {
			t.Fatalf("outbox %s still held by %s after the member stopped", l.Outbox, l.Owner)
		}
	}
	if n := cut.leaveFailures.Load(); n >= 0 {
		t.Fatalf("LeaveFleet was not tried past its failures (%d left)", n+1)
	}
}
