package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// fleetTests are the Fleet group: store.FleetControl, a relay fleet's coordination database.
// Expiry is by the database's clock: a short term, then a poll with a deadline until the
// database says it has passed.
func fleetTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"HeartbeatsAndMembersExpireByTheDatabasesClock", fleetMembers[TTx]},
		{"LeasesAcquireRenewReleaseAndTheTokenOnlyGrows", fleetLeases[TTx]},
		{"ConcurrentAcquiresHaveOneWinner", fleetConcurrentAcquire[TTx]},
		{"LeavingFreesTheMembersLeases", fleetLeave[TTx]},
		{"OutboxesRecordedWithTheOwnersBacklogAndForgotten", fleetOutboxes[TTx]},
		{"FleetsAreIsolated", fleetIsolation[TTx]},
	}
}

// shortTerm expires within a test; longTerm does not.
const (
	shortTerm = 300 * time.Millisecond
	longTerm  = time.Hour
)

func fleetOf[TTx any](t *testing.T, e *Env[TTx]) store.FleetControl {
	t.Helper()
	fc, ok := store.FleetControlOf(e.Store)
	if !ok {
		t.Fatalf("%T does not implement store.FleetControl", e.Store)
	}
	return fc
}

// within reports whether got is within tolerance of want (SQLite's clock is to the millisecond).
func within(got, want, tolerance time.Duration) bool {
	return got >= want-tolerance && got <= want+tolerance
}

func memberNamed(ms []store.FleetMember, name string) (store.FleetMember, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return store.FleetMember{}, false
}

func leaseOf(t *testing.T, fc store.FleetControl, fleet, outbox string) (store.Lease, time.Time) {
	t.Helper()
	leases, now, err := fc.FleetLeases(context.Background(), fleet)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Outbox == outbox {
			return l, now
		}
	}
	t.Fatalf("fleet %s has no lease of outbox %s (leases %+v)", fleet, outbox, leases)
	return store.Lease{}, now
}

// waitExpired polls the lease until the database's clock has passed its end.
func waitExpired(t *testing.T, fc store.FleetControl, fleet, outbox string) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool {
		l, now := leaseOf(t, fc, fleet, outbox)
		return !l.Held(now)
	}) {
		t.Fatalf("the lease of %s did not expire within 10s of a %s term", outbox, shortTerm)
	}
}

func fleetMembers[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	e := migrated(t, h)
	fc := fleetOf(t, e)
	started := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	at, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: "b", Host: "host-b", PID: 42, Started: started, Owned: 3}, longTerm)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(at); !within(d, 0, time.Minute) {
		t.Fatalf("heartbeat returned the clock %s, %s from this process's: not the database's now", at, d)
	}
	if _, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: "a", Host: "host-a", PID: 7}, shortTerm); err != nil {
		t.Fatal(err)
	}
	members, now, err := fc.FleetMembers(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || members[0].Name != "a" || members[1].Name != "b" {
		t.Fatalf("members %+v, want a and b by name", members)
	}
	b := members[1]
	if b.Host != "host-b" || b.PID != 42 || b.Owned != 3 || !b.Started.Equal(started) {
		t.Fatalf("member b reads %+v, want host-b, pid 42, owned 3, started %s", b, started)
	}
	if !b.HeartbeatAt.Equal(at) || b.ExpiresAt.Sub(b.HeartbeatAt) != longTerm {
		t.Fatalf("member b: heartbeat at %s expires %s; want the heartbeat's clock %s and a term of %s", b.HeartbeatAt, b.ExpiresAt, at, longTerm)
	}
	if !members[0].Started.IsZero() {
		t.Fatalf("member a gave no start time and reads %s", members[0].Started)
	}
	if now.Before(b.HeartbeatAt) {
		t.Fatalf("the members were read at %s, before b's heartbeat at %s", now, b.HeartbeatAt)
	}

	// a's term passes by the database's clock; b's does not. A heartbeat brings a back.
	if !waitFor(10*time.Second, func() bool {
		ms, now, err := fc.FleetMembers(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		a, _ := memberNamed(ms, "a")
		return !now.Before(a.ExpiresAt)
	}) {
		t.Fatalf("member a did not expire within 10s of a %s term", shortTerm)
	}
	ms, now, _ := fc.FleetMembers(ctx, "f")
	if b, _ := memberNamed(ms, "b"); !now.Before(b.ExpiresAt) {
		t.Fatalf("member b expired at %s with a term of %s", b.ExpiresAt, longTerm)
	}
	if _, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: "a", Host: "host-a2", PID: 8}, longTerm); err != nil {
		t.Fatal(err)
	}
	ms, now, _ = fc.FleetMembers(ctx, "f")
	if a, _ := memberNamed(ms, "a"); !now.Before(a.ExpiresAt) || a.Host != "host-a2" || a.PID != 8 {
		t.Fatalf("member a after a new heartbeat: %+v at %s, want live on host-a2, pid 8", a, now)
	}

	// A member whose heartbeat expired a day ago is forgotten at the next heartbeat: "old"
	// started two days ago, and its expiry is set to its start.
	if _, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: "old", Started: time.Now().Add(-48 * time.Hour)}, longTerm); err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, `UPDATE {{schema}}.fleet_members SET expires_at = started_at WHERE member = ?`, "old")
	if _, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: "b"}, longTerm); err != nil {
		t.Fatal(err)
	}
	ms, _, _ = fc.FleetMembers(ctx, "f")
	if _, ok := memberNamed(ms, "old"); ok || len(ms) != 2 {
		t.Fatalf("members %+v: a member expired two days ago is still known", ms)
	}

	for _, bad := range []struct {
		fleet, member string
		ttl           time.Duration
		want          string
	}{
		{"", "a", time.Second, "no name"},
		{"f", "", time.Second, "no name"},
		{"f", "a", 0, "must be positive"},
	} {
		if _, err := fc.FleetHeartbeat(ctx, bad.fleet, store.FleetMember{Name: bad.member}, bad.ttl); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("heartbeat of fleet %q member %q term %s: %v, want an error saying %q", bad.fleet, bad.member, bad.ttl, err, bad.want)
		}
	}
}

func fleetLeases[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	fc := fleetOf(t, migrated(t, h))
	acquire := func(outbox, member string, ttl time.Duration) (store.Lease, bool) {
		t.Helper()
		l, ok, err := fc.AcquireLease(ctx, "f", outbox, member, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return l, ok
	}
	renew := func(member string, ttl time.Duration, held ...store.Lease) []store.Lease {
		t.Helper()
		got, err := fc.RenewLeases(ctx, "f", member, held, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// A new lease: token 1, for the term asked.
	first, ok := acquire("o1", "a", longTerm)
	if !ok || first.Owner != "a" || first.Token != 1 || first.Outbox != "o1" {
		t.Fatalf("a acquires a free outbox: %+v ok=%v, want a's lease with token 1", first, ok)
	}
	if first.ExpiresAt.Sub(first.RenewedAt) != longTerm || first.AcquiredAt.IsZero() {
		t.Fatalf("lease %+v: want a term of %s from the database's clock", first, longTerm)
	}
	// Its holder acquiring it again renews it: same token, same acquisition.
	again, ok := acquire("o1", "a", longTerm)
	if !ok || again.Token != 1 || !again.AcquiredAt.Equal(first.AcquiredAt) || again.RenewedAt.Before(first.RenewedAt) {
		t.Fatalf("a acquires its own lease again: %+v ok=%v, want it renewed with token 1 (first %+v)", again, ok, first)
	}
	// Another member is refused and told who holds it.
	held, ok := acquire("o1", "b", longTerm)
	if ok || held.Owner != "a" || held.Token != 1 || !held.ExpiresAt.Equal(again.ExpiresAt) || !held.RenewedAt.Equal(again.RenewedAt) {
		t.Fatalf("b acquires a's lease: %+v ok=%v, want refused with a's lease untouched (%+v)", held, ok, again)
	}
	if got := renew("a", longTerm, again); len(got) != 1 || got[0].Token != 1 || got[0].Owner != "a" || got[0].RenewedAt.Before(again.RenewedAt) {
		t.Fatalf("a renews its lease: %+v, want it back with token 1", got)
	}
	// A release by the wrong member or with the wrong token does nothing.
	for _, wrong := range []struct {
		member string
		token  int64
	}{{"b", 1}, {"a", 2}} {
		if err := fc.ReleaseLease(ctx, "f", "o1", wrong.member, wrong.token); err != nil {
			t.Fatal(err)
		}
		if l, now := leaseOf(t, fc, "f", "o1"); !l.Held(now) || l.Owner != "a" {
			t.Fatalf("released by %s with token %d: %+v, want a's still", wrong.member, wrong.token, l)
		}
	}
	if err := fc.ReleaseLease(ctx, "f", "o1", "a", 1); err != nil {
		t.Fatal(err)
	}
	if l, now := leaseOf(t, fc, "f", "o1"); l.Held(now) || l.Owner != "" || l.Token != 1 || now.Before(l.ExpiresAt) {
		t.Fatalf("released: %+v at %s, want no owner, token 1 kept, ended", l, now)
	}
	// The next owner's token is one more; the old owner's renewal is refused.
	taken, ok := acquire("o1", "b", longTerm)
	if !ok || taken.Owner != "b" || taken.Token != 2 {
		t.Fatalf("b acquires the released lease: %+v ok=%v, want token 2", taken, ok)
	}
	if got := renew("a", longTerm, again); len(got) != 0 {
		t.Fatalf("a renews a lease b took: %+v, want none renewed", got)
	}
	if got := renew("b", longTerm, store.Lease{Outbox: "o1", Token: 1}); len(got) != 0 {
		t.Fatalf("b renews with a's token: %+v, want none renewed", got)
	}

	// An expired lease cannot be renewed, even when nobody took it, and passes to the next
	// member with the next token.
	short, _ := acquire("o2", "b", shortTerm)
	waitExpired(t, fc, "f", "o2")
	if got := renew("b", longTerm, short, taken); len(got) != 1 || got[0].Outbox != "o1" {
		t.Fatalf("b renews an expired lease and a live one: %+v, want only o1 renewed", got)
	}
	if l, ok := acquire("o2", "a", longTerm); !ok || l.Token != 2 || l.Owner != "a" {
		t.Fatalf("a acquires b's expired lease: %+v ok=%v, want token 2", l, ok)
	}
	// A member taking back its own expired lease gets a new token too: it may have stopped.
	own, _ := acquire("o3", "c", shortTerm)
	waitExpired(t, fc, "f", "o3")
	if l, ok := acquire("o3", "c", longTerm); !ok || l.Token != own.Token+1 {
		t.Fatalf("c acquires its own expired lease: %+v ok=%v, want token %d", l, ok, own.Token+1)
	}

	// Many leases renew in one call, and only those still held come back.
	var many []store.Lease
	for i := range 600 {
		l, ok := acquire(fmt.Sprintf("m%03d", i), "d", longTerm)
		if !ok {
			t.Fatalf("d acquires m%03d: refused", i)
		}
		many = append(many, l)
	}
	if err := fc.ReleaseLease(ctx, "f", "m123", "d", 1); err != nil {
		t.Fatal(err)
	}
	got := renew("d", longTerm, many...)
	if len(got) != 599 {
		t.Fatalf("d renews 600 leases, one released: %d renewed, want 599", len(got))
	}
	for _, l := range got {
		if l.Outbox == "m123" || l.Owner != "d" || l.Token != 1 {
			t.Fatalf("renewed %+v", l)
		}
	}
	if got := renew("d", longTerm); len(got) != 0 {
		t.Fatalf("renewing nothing: %+v", got)
	}

	leases, now, err := fc.FleetLeases(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 603 || leases[0].Outbox != "m000" || leases[600].Outbox != "o1" || now.IsZero() {
		t.Fatalf("%d leases, first %+v: want 603 by outbox, with the clock", len(leases), leases[0])
	}

	if _, _, err := fc.AcquireLease(ctx, "f", "o9", "a", 0); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("acquire with no term: %v, want refused", err)
	}
	if _, _, err := fc.AcquireLease(ctx, "f", "", "a", time.Second); err == nil || !strings.Contains(err.Error(), "outbox has no name") {
		t.Fatalf("acquire of no outbox: %v, want refused", err)
	}
	if _, err := fc.RenewLeases(ctx, "f", "a", many, -time.Second); err == nil {
		t.Fatal("renew with a negative term: accepted")
	}
}

// Members racing for one free outbox: exactly one gets it, and everyone agrees on who. Then
// the same for the lease released, round after round: the token grows by one a round.
func fleetConcurrentAcquire[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	e := migrated(t, h)
	stores := []store.FleetControl{fleetOf(t, e)}
	if e.Another != nil {
		env := &Env[TTx]{Store: e.Another(t)}
		stores = append(stores, fleetOf(t, env))
	}
	racers := h.sessions(t, 16)
	for round := int64(1); round <= 4; round++ {
		type result struct {
			member string
			l      store.Lease
			ok     bool
			err    error
		}
		results := make([]result, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				member := fmt.Sprintf("m%02d", i)
				<-start
				l, ok, err := stores[i%len(stores)].AcquireLease(ctx, "f", "o", member, longTerm)
				results[i] = result{member, l, ok, err}
			}()
		}
		close(start)
		wg.Wait()
		var winners []string
		for _, r := range results {
			if r.err != nil {
				t.Fatalf("round %d: %s: %v", round, r.member, r.err)
			}
			if r.ok {
				winners = append(winners, r.member)
			}
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d of %d racers got the lease (%v), want exactly one", round, len(winners), racers, winners)
		}
		for _, r := range results {
			if r.l.Owner != winners[0] || r.l.Token != round {
				t.Fatalf("round %d: %s was told %+v; the winner is %s, with token %d", round, r.member, r.l, winners[0], round)
			}
		}
		if err := stores[0].ReleaseLease(ctx, "f", "o", winners[0], round); err != nil {
			t.Fatal(err)
		}
	}
}

func fleetLeave[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	fc := fleetOf(t, migrated(t, h))
	for _, m := range []string{"a", "b"} {
		if _, err := fc.FleetHeartbeat(ctx, "f", store.FleetMember{Name: m}, longTerm); err != nil {
			t.Fatal(err)
		}
	}
	for _, take := range []struct{ outbox, member string }{{"o1", "a"}, {"o2", "a"}, {"o3", "b"}} {
		if _, ok, err := fc.AcquireLease(ctx, "f", take.outbox, take.member, longTerm); err != nil || !ok {
			t.Fatalf("%s acquires %s: ok=%v %v", take.member, take.outbox, ok, err)
		}
	}
	if err := fc.LeaveFleet(ctx, "f", "a"); err != nil {
		t.Fatal(err)
	}
	ms, _, err := fc.FleetMembers(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "b" {
		t.Fatalf("members after a left: %+v, want b alone", ms)
	}
	for _, o := range []string{"o1", "o2"} {
		if l, now := leaseOf(t, fc, "f", o); l.Held(now) || l.Owner != "" || l.Token != 1 {
			t.Fatalf("%s after its owner left: %+v, want released with token 1", o, l)
		}
	}
	if l, now := leaseOf(t, fc, "f", "o3"); !l.Held(now) || l.Owner != "b" {
		t.Fatalf("o3 after a left: %+v, want b's still", l)
	}
	if l, ok, err := fc.AcquireLease(ctx, "f", "o1", "b", longTerm); err != nil || !ok || l.Token != 2 {
		t.Fatalf("b acquires o1 after a left: %+v ok=%v %v, want token 2", l, ok, err)
	}
	if err := fc.LeaveFleet(ctx, "f", "nobody"); err != nil {
		t.Fatalf("a member that is not in the fleet leaves: %v", err)
	}
}

func outboxNamed(os []store.FleetOutbox, name string) (store.FleetOutbox, bool) {
	for _, o := range os {
		if o.Name == name {
			return o, true
		}
	}
	return store.FleetOutbox{}, false
}

func fleetOutboxes[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	fc := fleetOf(t, migrated(t, h))
	read := func() ([]store.FleetOutbox, time.Time) {
		t.Helper()
		os, now, err := fc.FleetOutboxes(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		return os, now
	}
	record := func(member string, forget time.Duration, os ...store.FleetOutbox) {
		t.Helper()
		if err := fc.RecordFleetOutboxes(ctx, "f", member, os, forget); err != nil {
			t.Fatal(err)
		}
	}
	// a owns x and reads its backlog; y is disabled and nobody reads it.
	record("a", longTerm,
		store.FleetOutbox{Name: "x", Tenant: "t1", Pending: 5, OldestPendingAge: 2 * time.Second, StatsAt: time.Now()},
		store.FleetOutbox{Name: "y", Tenant: "t2", Disabled: true})
	os, now := read()
	if len(os) != 2 {
		t.Fatalf("outboxes %+v, want x and y", os)
	}
	x, y := os[0], os[1]
	if x.Name != "x" || x.Tenant != "t1" || x.Disabled || x.RecordedBy != "a" || x.Pending != 5 || x.OldestPendingAge != 2*time.Second ||
		x.StatsAt.IsZero() || x.Error != "" || !x.FirstRecordedAt.Equal(x.RecordedAt) || now.Before(x.RecordedAt) {
		t.Fatalf("x reads %+v at %s", x, now)
	}
	if y.Name != "y" || !y.Disabled || y.Tenant != "t2" || !y.StatsAt.IsZero() || y.Pending != 0 {
		t.Fatalf("y reads %+v", y)
	}
	if d := now.Sub(x.StatsAt); !within(d, 0, time.Minute) {
		t.Fatalf("x's reading is dated %s, %s before the database's clock: want the database's clock when recorded", x.StatsAt, d)
	}

	// b records the same catalog without a reading: the owner's reading stays, the record is b's.
	record("b", longTerm, store.FleetOutbox{Name: "x", Tenant: "t1"}, store.FleetOutbox{Name: "y", Tenant: "t2", Disabled: true})
	os, _ = read()
	x2, _ := outboxNamed(os, "x")
	if x2.RecordedBy != "b" || x2.Pending != 5 || x2.OldestPendingAge != 2*time.Second || !x2.StatsAt.Equal(x.StatsAt) ||
		!x2.FirstRecordedAt.Equal(x.FirstRecordedAt) || x2.RecordedAt.Before(x.RecordedAt) {
		t.Fatalf("x after b's record: %+v, want a's reading kept (%+v)", x2, x)
	}
	// A new reading replaces the old one, failure included; the last of a name given wins.
	record("a", longTerm, store.FleetOutbox{Name: "x", Tenant: "t1", Pending: 1, StatsAt: time.Now()},
		store.FleetOutbox{Name: "x", Tenant: "t1", Pending: 7, StatsAt: time.Now(), Error: "cannot reach it"})
	os, _ = read()
	if x3, _ := outboxNamed(os, "x"); x3.Pending != 7 || x3.OldestPendingAge != 0 || x3.Error != "cannot reach it" || x3.StatsAt.Before(x2.StatsAt) {
		t.Fatalf("x after a new reading: %+v", x3)
	}

	// An outbox no member records any more is forgotten after forgetAfter; one recorded is kept.
	record("a", longTerm, store.FleetOutbox{Name: "x"})
	if os, _ = read(); len(os) != 2 {
		t.Fatalf("y was forgotten at once: %+v", os)
	}
	if !waitFor(10*time.Second, func() bool {
		record("a", time.Second, store.FleetOutbox{Name: "x"})
		os, _ := read()
		_, yKnown := outboxNamed(os, "y")
		if _, xKnown := outboxNamed(os, "x"); !xKnown {
			t.Fatal("x was forgotten as it was recorded")
		}
		return !yKnown
	}) {
		t.Fatal("y, recorded by nobody, was not forgotten within 10s with forgetAfter 1s")
	}

	// A catalog of 500 goes in batches, not a statement per outbox.
	var big []store.FleetOutbox
	for i := range 500 {
		big = append(big, store.FleetOutbox{Name: fmt.Sprintf("c%03d", i), Tenant: fmt.Sprintf("t%d", i), Pending: int64(i), StatsAt: time.Now()})
	}
	start := time.Now()
	record("a", longTerm, big...)
	took := time.Since(start)
	start = time.Now()
	record("b", longTerm, big...)
	t.Logf("%s: a catalog of 500 outboxes recorded in %s, again in %s", h.Name, took, time.Since(start))
	os, _ = read()
	if len(os) != 501 || os[0].Name != "c000" || os[499].Pending != 499 || os[499].Tenant != "t499" || os[500].Name != "x" {
		t.Fatalf("%d outboxes after a catalog of 500: want 501 by name", len(os))
	}

	for _, bad := range []struct {
		member string
		os     []store.FleetOutbox
		forget time.Duration
	}{{"", nil, time.Hour}, {"a", nil, 0}, {"a", []store.FleetOutbox{{Name: ""}}, time.Hour}} {
		if err := fc.RecordFleetOutboxes(ctx, "f", bad.member, bad.os, bad.forget); err == nil {
			t.Fatalf("record by %q of %+v, forgetting after %s: accepted", bad.member, bad.os, bad.forget)
		}
	}
}

// Two fleets in one coordination database share nothing: names of members and outboxes repeat.
func fleetIsolation[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	ctx := context.Background()
	fc := fleetOf(t, migrated(t, h))
	for _, f := range []string{"f1", "f2"} {
		if _, err := fc.FleetHeartbeat(ctx, f, store.FleetMember{Name: "a", Host: f}, longTerm); err != nil {
			t.Fatal(err)
		}
		if err := fc.RecordFleetOutboxes(ctx, f, "a", []store.FleetOutbox{{Name: "o", Tenant: f}}, longTerm); err != nil {
			t.Fatal(err)
		}
	}
	if l, ok, err := fc.AcquireLease(ctx, "f1", "o", "a", longTerm); err != nil || !ok || l.Token != 1 {
		t.Fatalf("a acquires o in f1: %+v ok=%v %v", l, ok, err)
	}
	if l, ok, err := fc.AcquireLease(ctx, "f2", "o", "b", longTerm); err != nil || !ok || l.Token != 1 {
		t.Fatalf("b acquires o in f2 while a holds o in f1: %+v ok=%v %v, want token 1", l, ok, err)
	}
	if err := fc.LeaveFleet(ctx, "f1", "a"); err != nil {
		t.Fatal(err)
	}
	if err := fc.LeaveFleet(ctx, "f2", "b"); err != nil {
		t.Fatal(err)
	}
	if ms, _, _ := fc.FleetMembers(ctx, "f2"); len(ms) != 1 || ms[0].Name != "a" || ms[0].Host != "f2" {
		t.Fatalf("f2's members after a left f1: %+v, want a (of f2)", ms)
	}
	if ms, _, _ := fc.FleetMembers(ctx, "f1"); len(ms) != 0 {
		t.Fatalf("f1's members after a left: %+v", ms)
	}
	if l, ok, err := fc.AcquireLease(ctx, "f2", "o", "a", longTerm); err != nil || !ok || l.Token != 2 {
		t.Fatalf("a acquires o in f2 after b left: %+v ok=%v %v, want token 2", l, ok, err)
	}
	if l, now := leaseOf(t, fc, "f1", "o"); l.Held(now) || l.Token != 1 {
		t.Fatalf("f1's lease of o: %+v, want released with token 1", l)
	}
	// Forgetting in one fleet leaves the other's outboxes.
	if !waitFor(10*time.Second, func() bool {
		if err := fc.RecordFleetOutboxes(ctx, "f1", "a", nil, time.Second); err != nil {
			t.Fatal(err)
		}
		os, _, _ := fc.FleetOutboxes(ctx, "f1")
		return len(os) == 0
	}) {
		t.Fatal("f1's outbox was not forgotten within 10s")
	}
	if os, _, _ := fc.FleetOutboxes(ctx, "f2"); len(os) != 1 || os[0].Tenant != "f2" {
		t.Fatalf("f2's outboxes after f1 forgot its own: %+v", os)
	}
}
