package console

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func snap(at time.Time, beats ...store.RelayBeat) *snapshot {
	return &snapshot{at: at, relays: beats, backlog: []store.TopicBacklog{{Topic: "shop.orders", Pending: 7}},
		totals: []store.SideTotal{{Side: "outbox", Topic: "shop.orders", Count: 2}, {Side: "outbox", Topic: "shop.payments", Count: 1}, {Side: "billing", Count: 5}},
		lag:    map[[2]string]lagResult{{"billing", "shop.orders"}: {lag: Lag{Waiting: 40}}, {"billing", "shop.payments"}: {lag: Lag{Waiting: 2}}, {"search", "shop.orders"}: {err: fmt.Errorf("unreachable")}}}
}

func TestHistorySamplesEachSnapshotOnce(t *testing.T) {
	h := newHistory(20 * time.Second)
	s := snap(t0)
	h.add(s)
	h.add(s)
	h.add(snap(t0.Add(-time.Second))) // older than the last sample: not a new one
	got := h.samples(nil)
	if len(got) != 1 {
		t.Fatalf("%d samples of one snapshot", len(got))
	}
	g := got[0]
	if g.topics["shop.orders"].pending != 7 || g.outboxDead != 3 || g.consumers["billing"].dead != 5 || g.consumers["billing"].waiting != 42 ||
		!g.consumers["billing"].hasLag || g.consumers["search"].hasLag || !g.lagRead || g.rated {
		t.Fatalf("the sample: %+v", g)
	}
}

// The ring holds the last hour and never more than its size, however often it is given a snapshot.
func TestHistoryKeepsTheLastHourInABoundedRing(t *testing.T) {
	h := newHistory(20 * time.Second)
	for i := range 1000 {
		h.add(snap(t0.Add(time.Duration(i) * 20 * time.Second)))
	}
	got := h.samples(nil)
	last := t0.Add(999 * 20 * time.Second)
	if len(got) != 181 || !got[0].at.Equal(last.Add(-time.Hour)) || !got[180].at.Equal(last) {
		t.Fatalf("%d samples from %s to %s, want 181 over the hour to %s", len(got), got[0].at, got[len(got)-1].at, last)
	}
	for i := 1; i < len(got); i++ {
		if !got[i].at.After(got[i-1].at) {
			t.Fatalf("sample %d is not after the one before", i)
		}
	}
	h = newHistory(20 * time.Second)
	for i := range 1000 { // a second apart: bounded by the ring's size, not the hour
		h.add(snap(t0.Add(time.Duration(i) * time.Second)))
	}
	if got := h.samples(nil); len(got) != len(h.ring) || len(h.ring) != 182 || !got[len(got)-1].at.Equal(t0.Add(999*time.Second)) {
		t.Fatalf("%d samples in a ring of %d", len(got), len(h.ring))
	}
	if h := newHistory(time.Millisecond); len(h.ring) != historyMaxSamples {
		t.Fatalf("a ring of %d samples for a 1 ms interval", len(h.ring))
	}
	if h := newHistory(-1); len(h.ring) != 0 {
		t.Fatal("no charts, yet a ring")
	}
}

func beat(owner string, started, at time.Time, byTopic map[string]int64) store.RelayBeat {
	var total int64
	for _, n := range byTopic {
		total += n
	}
	return store.RelayBeat{Owner: owner, Started: started, At: at, PublishedTotal: total, PublishedByTopic: byTopic}
}

// A rate is what a relay's count grew by between its heartbeats at two samples, over the time
// between those heartbeats; a relay first seen counts from its start if it started since the
// sample before; a count that went down (reset) counts from zero.
func TestHistoryRatesFromTheRelaysCounts(t *testing.T) {
	h := newHistory(20 * time.Second)
	long := t0.Add(-time.Hour)
	rate := func(i int, topic string) (float64, bool) {
		s := h.samples(nil)[i]
		r := s.topics[topic]
		return r.rate, s.rated
	}
	want := func(i int, topic string, w float64) {
		t.Helper()
		got, rated := rate(i, topic)
		if !rated || math.Abs(got-w) > 1e-9 {
			t.Errorf("sample %d: %s at %g rows/s (rated %v), want %g", i, topic, got, rated, w)
		}
	}
	h.add(snap(t0, beat("a", long, t0.Add(-time.Second), map[string]int64{"shop.orders": 1000})))
	if _, rated := rate(0, "shop.orders"); rated {
		t.Fatal("the first sample has a rate: it has no sample before it")
	}
	h.add(snap(t0.Add(20*time.Second), beat("a", long, t0.Add(19*time.Second), map[string]int64{"shop.orders": 1400, "shop.payments": 200}),
		beat("c", long, t0.Add(19*time.Second), map[string]int64{"shop.orders": 99999}))) // c: first seen, started long ago: left out
	want(1, "shop.orders", 20)
	want(1, "shop.payments", 10)

	// No heartbeat of a since: nothing counted now; at its next one, the whole time since.
	h.add(snap(t0.Add(40*time.Second), beat("a", long, t0.Add(19*time.Second), map[string]int64{"shop.orders": 1400, "shop.payments": 200}),
		beat("c", long, t0.Add(39*time.Second), map[string]int64{"shop.orders": 99999 + 400})))
	want(2, "shop.orders", 20) // c's 400 over its 20 s
	h.add(snap(t0.Add(60*time.Second), beat("a", long, t0.Add(59*time.Second), map[string]int64{"shop.orders": 2200, "shop.payments": 200}),
		beat("c", long, t0.Add(59*time.Second), map[string]int64{"shop.orders": 99999 + 400})))
	want(3, "shop.orders", 20) // a's 800 over the 40 s since its heartbeat at sample 1
	want(3, "shop.payments", 0)

	// a restarts under the same owner (its counts from zero, its start after its last heartbeat);
	// b starts after the sample before.
	h.add(snap(t0.Add(80*time.Second), beat("a", t0.Add(69*time.Second), t0.Add(79*time.Second), map[string]int64{"shop.orders": 50}),
		beat("b", t0.Add(74*time.Second), t0.Add(79*time.Second), map[string]int64{"shop.orders": 30})))
	want(4, "shop.orders", 50.0/10+30.0/5)

	// One topic's count alone went down: counted from zero too.
	h.add(snap(t0.Add(100*time.Second), beat("a", t0.Add(69*time.Second), t0.Add(99*time.Second), map[string]int64{"shop.orders": 10, "shop.payments": 200}),
		beat("b", t0.Add(74*time.Second), t0.Add(99*time.Second), map[string]int64{"shop.orders": 30})))
	want(5, "shop.orders", 10.0/20)

	// No heartbeat since, of relays that are not gone: the rate is not known (a gap), not zero.
	h.add(snap(t0.Add(105*time.Second), beat("a", t0.Add(69*time.Second), t0.Add(99*time.Second), map[string]int64{"shop.orders": 10, "shop.payments": 200}),
		beat("b", t0.Add(74*time.Second), t0.Add(99*time.Second), map[string]int64{"shop.orders": 30})))
	if _, rated := rate(6, "shop.orders"); rated {
		t.Error("a rate with no heartbeat since the sample before")
	}
	if len(h.beats) != 2 {
		t.Errorf("the heartbeats kept: %v, want a's and b's (c is no longer listed)", h.beats)
	}
}

func TestHistoryFoldsTopicsBeyondItsBound(t *testing.T) {
	m := map[string]topicSample{}
	for i := range historySeries + 50 {
		m[fmt.Sprintf("t%03d", i)] = topicSample{pending: int64(i), rate: 1, hasRate: true}
	}
	foldTopics(m)
	if len(m) != historySeries+1 || m[""].pending != 50*49/2 || m[""].rate != 50 || m["t149"].pending != 149 {
		t.Fatalf("%d topics, the rest %+v", len(m), m[""])
	}
}

// The loop samples at every tick, on the handler's clock, the figures the cache
// holds (a step of 20 s outlasts a CacheTTL of 1 s: each step is a new snapshot); Stop ends it
// (TestMain looks for a goroutine left behind).
func TestHistoryLoopSamplesUntilStop(t *testing.T) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "console.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.DB().Close()
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := t0
	h, err := New(Config{Store: s, Auth: Auth{LocalOnly: true}, ChartInterval: 5 * time.Millisecond, DisableJobs: true, CacheTTL: time.Second,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("sample %d", i+1), func() bool { return len(h.history.samples(nil)) == i+1 })
		mu.Lock()
		now = now.Add(20 * time.Second)
		mu.Unlock()
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := h.history.samples(nil)
	for i, smp := range got[:5] {
		if want := t0.Add(time.Duration(i) * 20 * time.Second); !smp.at.Equal(want) {
			t.Errorf("sample %d at %s, want %s", i, smp.at, want)
		}
	}
	if off, _ := New(Config{Store: s, Auth: Auth{LocalOnly: true}, ChartInterval: -1}); off.history.every > 0 || len(off.history.ring) != 0 {
		t.Error("ChartInterval -1 still charts")
	}
	if _, err := New(Config{Store: s, Auth: Auth{LocalOnly: true}, ChartInterval: time.Hour}); err == nil {
		t.Error("ChartInterval 1h is accepted")
	}
}
