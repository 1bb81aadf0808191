package console

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// history keeps the last hour of the overview's figures for its charts, in memory: every
// ChartInterval it takes a sample of what the cache read (no query of its own), into a ring of at
// most historySpan/ChartInterval samples, each of at most historySeries topics and consumers. A
// console started a minute ago shows a minute; a restarted one starts again.
//
// The publish rate comes from the relays' heartbeats: each reports the rows it published per topic
// since it started (store.RelayBeat.PublishedByTopic), a count that only grows, and a sample's
// rate is what that count grew by since the relay's heartbeat of the previous sample, over the
// time between the two heartbeats.
type history struct {
	every   time.Duration
	running atomic.Bool // while run runs

	mu   sync.Mutex // guards the fields below
	ring []sample   // a ring of len(ring) samples, n of them taken, the oldest at head
	head int
	n    int
	// beats are each relay's heartbeat at the previous sample, by owner: the counts a rate grows from.
	beats map[string]store.RelayBeat
}

// sample is the figures of one moment: per topic, per consumer, and the outbox's dead letters.
type sample struct {
	at        time.Time
	topics    map[string]topicSample    // "" holds the topics beyond historySeries, summed
	consumers map[string]consumerSample // "" holds the consumers beyond historySeries, summed
	// outboxDead is the outbox's dead letters, every topic's.
	outboxDead int64
	// relays is whether any relay had reported; rated whether the sample has rates (it had a
	// sample before it, and a relay told): a topic without a rate in a rated sample published
	// nothing.
	relays, rated bool
	// lagRead is whether the broker's backlog was read (a Lag func and consumers' topics).
	lagRead bool
}

type topicSample struct {
	pending int64
	rate    float64 // rows a second; meaningful when hasRate
	hasRate bool
}

type consumerSample struct {
	dead    int64
	waiting int64 // the broker's backlog, summed over the consumer's topics; meaningful when hasLag
	hasLag  bool
}

// historySpan is what the charts show; historySeries is how many topics and how many consumers a
// sample keeps on their own (the largest), which bounds a sample's memory however many there are.
const (
	historySpan   = time.Hour
	historySeries = 100
	// historyMaxSamples bounds the ring when ChartInterval is short (a test's).
	historyMaxSamples = 3600
)

func newHistory(every time.Duration) *history {
	size := 0
	if every > 0 {
		size = min(historyMaxSamples, int(historySpan/every)+2)
	}
	return &history{every: every, ring: make([]sample, size), beats: map[string]store.RelayBeat{}}
}

// run takes a sample every h.every until ctx ends, the first after h.every: a sample at once
// would fill the cache at start, and the first pages would show figures read before the relays'
// first heartbeats (until the next refresh) where they read their own. The charts draw the
// page's figures meanwhile.
func (h *history) run(ctx context.Context, c *cache) {
	h.running.Store(true)
	defer h.running.Store(false)
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A failed read leaves a gap in the charts, which shows it; the cache's own refresh logs
		// why (keepWarm), so it is not logged twice.
		if s, err := c.read(ctx); err == nil {
			h.add(s)
		}
	}
}

// add takes a sample of s, unless s is the snapshot of the previous sample (no refresh since).
// It drops what is older than historySpan, and the oldest sample when the ring is full.
func (h *history) add(s *snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) == 0 || (h.n > 0 && !s.at.After(h.at(h.n-1).at)) {
		return
	}
	smp := h.sampleOf(s)
	// Each relay's heartbeat is kept for the next sample's rates; one the store no longer lists
	// (a day after its last heartbeat) is forgotten.
	seen := map[string]bool{}
	for _, b := range s.relays {
		seen[b.Owner] = true
		if prev, ok := h.beats[b.Owner]; !ok || b.At.After(prev.At) {
			h.beats[b.Owner] = b
		}
	}
	for owner := range h.beats {
		if !seen[owner] {
			delete(h.beats, owner)
		}
	}
	if h.n == len(h.ring) {
		h.ring[h.head] = sample{}
		h.head = (h.head + 1) % len(h.ring)
		h.n--
	}
	h.ring[(h.head+h.n)%len(h.ring)] = smp
	h.n++
	for h.n > 0 && h.at(0).at.Before(s.at.Add(-historySpan)) {
		h.ring[h.head] = sample{}
		h.head = (h.head + 1) % len(h.ring)
		h.n--
	}
}

// sampleOf is the sample of s after the last one, its rates from the heartbeats kept then; it
// changes nothing. h.mu is held.
func (h *history) sampleOf(s *snapshot) sample {
	smp := sample{at: s.at, topics: map[string]topicSample{}, consumers: map[string]consumerSample{}, relays: len(s.relays) > 0, lagRead: len(s.lag) > 0}
	for _, b := range s.backlog {
		t := smp.topics[b.Topic]
		t.pending += b.Pending
		smp.topics[b.Topic] = t
	}
	if h.n > 0 { // a rate needs a sample before
		var rates map[string]float64
		rates, smp.rated = h.rates(s.relays, s.at, h.at(h.n-1).at)
		for topic, r := range rates {
			t := smp.topics[topic]
			t.rate, t.hasRate = r, true
			smp.topics[topic] = t
		}
	}
	for _, t := range s.totals {
		if t.Side == store.SideOutbox {
			smp.outboxDead += t.Count
			continue
		}
		c := smp.consumers[t.Side]
		c.dead += t.Count
		smp.consumers[t.Side] = c
	}
	for key, l := range s.lag {
		c := smp.consumers[key[0]]
		if l.err == nil {
			c.waiting += l.lag.Waiting
			c.hasLag = true
		}
		smp.consumers[key[0]] = c
	}
	foldTopics(smp.topics)
	foldConsumers(smp.consumers)
	return smp
}

// rates are the rows a second each topic was published at, as of at, from each relay's heartbeat
// then and at the previous sample (taken at prevAt). A relay first seen counts from its start
// when it started after the previous sample, and is left out otherwise (what it published
// before is not this interval's). A count lower than before (a relay's counters reset under the
// same owner) counts from zero, since the relay's start when that is after the previous
// heartbeat. A relay without a heartbeat since the previous sample counts at its next one, the
// whole time since; a gone one (none for relayGone) publishes nothing. known is false when no
// relay told: the rate is not known, which is not zero.
func (h *history) rates(beats []store.RelayBeat, at, prevAt time.Time) (out map[string]float64, known bool) {
	out = map[string]float64{}
	for _, b := range beats {
		from, counts := b.Started, map[string]int64(nil)
		prev, seen := h.beats[b.Owner]
		switch {
		case seen && !b.At.After(prev.At), !seen && b.Started.Before(prevAt):
			known = known || at.Sub(b.At) > relayGone
			continue
		case seen && b.PublishedTotal >= prev.PublishedTotal:
			from, counts = prev.At, prev.PublishedByTopic
		case seen && b.Started.Before(prev.At):
			from = prev.At
		}
		secs := b.At.Sub(from).Seconds()
		if secs <= 0 {
			continue
		}
		known = true
		for topic, n := range b.PublishedByTopic {
			d := n - counts[topic]
			if d < 0 { // this topic's count alone went down: the same reset
				d = n
			}
			out[topic] += float64(d) / secs
		}
	}
	return out, known
}

// at is the i-th sample, oldest first. h.mu is held.
func (h *history) at(i int) *sample {
	return &h.ring[(h.head+i)%len(h.ring)]
}

// count is how many samples it keeps.
func (h *history) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// samples copies the samples, oldest first, and when latest is newer than the last of them, a
// sample of it at the end, not kept: the page that shows the charts shows its own figures at
// "now", and the next tick samples them for good. A sample is never changed once taken, so the
// copy shares its maps.
func (h *history) samples(latest *snapshot) []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]sample, h.n, h.n+1)
	for i := range out {
		out[i] = *h.at(i)
	}
	if latest != nil && len(h.ring) > 0 && (h.n == 0 || latest.at.After(h.at(h.n-1).at)) {
		out = append(out, h.sampleOf(latest))
	}
	return out
}

// foldTopics keeps the historySeries topics with the most rows pending (then the fastest) on
// their own and sums the rest under "".
func foldTopics(m map[string]topicSample) {
	fold(m, func(a, b topicSample) bool {
		if a.pending != b.pending {
			return a.pending > b.pending
		}
		return a.rate > b.rate
	}, func(rest *topicSample, t topicSample) {
		rest.pending += t.pending
		rest.rate += t.rate
		rest.hasRate = rest.hasRate || t.hasRate
	})
}

// foldConsumers keeps the historySeries consumers with the most dead letters (then the largest
// backlog) on their own and sums the rest under "".
func foldConsumers(m map[string]consumerSample) {
	fold(m, func(a, b consumerSample) bool {
		if a.dead != b.dead {
			return a.dead > b.dead
		}
		return a.waiting > b.waiting
	}, func(rest *consumerSample, c consumerSample) {
		rest.dead += c.dead
		rest.waiting += c.waiting
		rest.hasLag = rest.hasLag || c.hasLag
	})
}

// fold keeps the historySeries entries of m that come first by before (then by name) on their
// own, and adds the rest into one entry under "".
func fold[T any](m map[string]T, before func(a, b T) bool, add func(rest *T, t T)) {
	if len(m) <= historySeries {
		return
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := m[names[i]], m[names[j]]
		if before(a, b) != before(b, a) {
			return before(a, b)
		}
		return names[i] < names[j]
	})
	var rest T
	for _, n := range names[historySeries:] {
		add(&rest, m[n])
		delete(m, n)
	}
	m[""] = rest
}
