package console

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// cache keeps the figures that would cost a scan on every page — the overview's, the unfiltered
// failure groups, the side totals — for CacheTTL, read by one request while the others wait for
// it; and the patterns of failure groups, which never change (a pattern is a function of any of
// its letters' error).
type cache struct {
	h *Handler

	mu        sync.Mutex // guards the fields below
	refreshMu sync.Mutex // one refresh at a time
	// warm is set while Start's loop refreshes the figures before they expire: requests then
	// read them as they are and never wait for a refresh.
	warm     atomic.Bool
	snap     *snapshot
	gen      int64                  // bumped by invalidate: a refresh begun before it is not kept
	groups   map[string]groupsEntry // by side ("" everywhere)
	schemaAt time.Time
	schema   int
	newest   int
	schemaE  error
	prev     map[string]store.RelayBeat // the previous sample of each relay, for rates

	patMu    sync.Mutex
	patterns map[string]groupInfo // side/group → pattern
}

type groupInfo struct {
	Pattern, EventType, Example, Topic string
}

type groupsEntry struct {
	at     time.Time
	groups []store.GroupCount
}

// snapshot is what the overview and the tabs read.
type snapshot struct {
	at            time.Time
	totals        []store.SideTotal
	backlog       []store.TopicBacklog
	backlogCapped bool
	processed     []store.ConsumerCount
	parked        map[string]int64
	relays        []store.RelayBeat
	pauses        []store.Pause
	rates         map[string]float64 // relay owner → rows a second
	topicRates    map[string]float64 // topic → rows a second
	groups        []store.GroupCount
	lag           map[[2]string]lagResult // (consumer, topic)
}

type lagResult struct {
	lag Lag
	err error
}

func newCache(h *Handler) *cache {
	return &cache{h: h, groups: map[string]groupsEntry{}, prev: map[string]store.RelayBeat{}, patterns: map[string]groupInfo{}}
}

// invalidate makes the next read refresh: after an action, the person sees its effect.
func (c *cache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snap = nil
	c.gen++
	c.groups = map[string]groupsEntry{}
}

// schemaState reads (every 5 seconds at most) the version the tables are at.
func (c *cache) schemaState(ctx context.Context) (current, newest int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.schemaAt) < 5*time.Second && c.schemaE == nil && c.schema > 0 {
		return c.schema, c.newest, nil
	}
	c.schema, c.newest, c.schemaE = c.h.con.SchemaVersion(ctx)
	c.schemaAt = time.Now()
	return c.schema, c.newest, c.schemaE
}

func (c *cache) schemaVersion() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.schema
}

// schemaProblem says, for a person, why the console cannot work on these tables; "" when it can.
func (c *cache) schemaProblem(ctx context.Context) string {
	current, newest, err := c.schemaState(ctx)
	info := c.h.db.Info()
	switch {
	case err != nil:
		return fmt.Sprintf("Cannot read the schema version of %s %s: %v", info.Name, info.Schema, err)
	case current == 0:
		return fmt.Sprintf("%s %s has no outboxkit tables. This console needs schema version %d: run `outboxctl migrate --db URL` (with the same --schema).",
			info.Name, info.Schema, newest)
	case current < newest:
		return fmt.Sprintf("%s %s is at schema version %d; this console needs version %d (its tables and indexes). Run `outboxctl migrate --db URL` — safe while relays and consumers run.",
			info.Name, info.Schema, current, newest)
	case current > newest:
		return fmt.Sprintf("%s %s was migrated by a newer outboxkit (schema version %d); this console knows versions up to %d: upgrade the console.",
			info.Name, info.Schema, current, newest)
	}
	return ""
}

// fresh reports whether figures read at at may be shown now.
func (c *cache) fresh(at time.Time) bool {
	age := c.h.cfg.Now().Sub(at)
	return age < c.h.cfg.CacheTTL || (c.warm.Load() && age < 3*c.h.cfg.CacheTTL)
}

func (c *cache) read(ctx context.Context) (*snapshot, error) {
	c.mu.Lock()
	s := c.snap
	c.mu.Unlock()
	if s != nil && c.fresh(s.at) {
		return s, nil
	}
	return c.refresh(ctx, false)
}

// refresh reads every figure of the overview again. A request waiting for another's refresh
// takes its result.
func (c *cache) refresh(ctx context.Context, background bool) (*snapshot, error) {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	now := c.h.cfg.Now()
	c.mu.Lock()
	old, gen := c.snap, c.gen
	c.mu.Unlock()
	if old != nil && !background && c.fresh(old.at) {
		return old, nil
	}
	con := c.h.con
	s := &snapshot{at: now, rates: map[string]float64{}, topicRates: map[string]float64{}, lag: map[[2]string]lagResult{}}
	var err error
	if s.totals, err = con.DeadLetterTotals(ctx); err != nil {
		return nil, err
	}
	if s.backlog, s.backlogCapped, err = con.TopicBacklog(ctx, c.h.cfg.BacklogHeadRows); err != nil {
		return nil, err
	}
	if s.processed, err = con.ProcessedSince(ctx, now.Add(-time.Minute), 100000); err != nil {
		return nil, err
	}
	if s.parked, err = con.ParkedCounts(ctx); err != nil {
		return nil, err
	}
	if s.relays, err = con.Relays(ctx); err != nil {
		return nil, err
	}
	if s.pauses, err = con.Pauses(ctx); err != nil {
		return nil, err
	}
	if s.groups, err = con.GroupCounts(ctx, store.LetterQuery{}, 0); err != nil {
		return nil, err
	}
	for _, b := range s.relays {
		prev, ok := c.prev[b.Owner]
		// Over the last sample, or since the relay started.
		from, total, byTopic := b.Started, int64(0), map[string]int64{}
		if ok && b.At.After(prev.At) {
			from, total, byTopic = prev.At, prev.PublishedTotal, prev.PublishedByTopic
		}
		if secs := b.At.Sub(from).Seconds(); secs > 0 && now.Sub(b.At) < time.Minute {
			s.rates[b.Owner] = float64(b.PublishedTotal-total) / secs
			for t, n := range b.PublishedByTopic {
				s.topicRates[t] += float64(n-byTopic[t]) / secs
			}
		}
		if !ok || b.At.After(prev.At) {
			c.prev[b.Owner] = b
		}
	}
	if c.h.cfg.Lag != nil {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for consumer, topics := range c.h.cfg.Consumers {
			for _, topic := range topics {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					l, err := c.h.cfg.Lag(lctx, topic, consumer)
					mu.Lock()
					s.lag[[2]string{consumer, topic}] = lagResult{l, err}
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
	}
	c.mu.Lock()
	if c.gen == gen { // read before an action changed what it counts: shown once, not kept
		c.snap = s
		c.groups[""] = groupsEntry{at: now, groups: s.groups}
	}
	c.mu.Unlock()
	return s, nil
}

// keepWarm refreshes the figures before they expire, and the failure groups of each side read
// lately, until ctx ends: no request waits for a scan of a million letters.
func (c *cache) keepWarm(ctx context.Context) {
	c.warm.Store(true)
	defer c.warm.Store(false)
	t := time.NewTicker(max(time.Second, c.h.cfg.CacheTTL/2))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := c.refresh(ctx, true); err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrNotMigrated) {
			c.h.cfg.Logger.Error("Cannot refresh the console's figures", err, nil)
		}
		c.mu.Lock()
		gen := c.gen
		var sides []string
		for side, e := range c.groups {
			if side != "" && c.h.cfg.Now().Sub(e.at) < 10*c.h.cfg.CacheTTL { // read lately
				sides = append(sides, side)
			}
		}
		c.mu.Unlock()
		for _, side := range sides {
			if g, err := c.h.con.GroupCounts(ctx, store.LetterQuery{Side: side}, 0); err == nil {
				c.mu.Lock()
				if c.gen == gen {
					c.groups[side] = groupsEntry{at: c.h.cfg.Now(), groups: g}
				}
				c.mu.Unlock()
			}
		}
	}
}

// groupCounts is the failure groups of q: cached for a selection by side alone, read otherwise.
func (c *cache) groupCounts(ctx context.Context, q store.LetterQuery) ([]store.GroupCount, string, error) {
	plain := store.LetterQuery{Side: q.Side}
	bySide := q.Side != "" && q.Side != store.SideConsumers
	if !q.Unindexed() && q.PartitionKey == "" && q.From.IsZero() && q.Until.IsZero() && len(q.IDs) == 0 && !q.Archived {
		now := c.h.cfg.Now()
		c.mu.Lock()
		e, ok := c.groups[q.Side]
		gen := c.gen
		c.mu.Unlock()
		if !ok || !c.fresh(e.at) {
			g, err := c.h.con.GroupCounts(ctx, plain, 0)
			if err != nil {
				return nil, "", err
			}
			e = groupsEntry{at: now, groups: g}
			c.mu.Lock()
			if c.gen == gen {
				c.groups[q.Side] = e
			}
			c.mu.Unlock()
		}
		out := e.groups
		if q.ByGroup || bySide {
			out = nil
			for _, g := range e.groups {
				if (!q.ByGroup || g.FailureGroup == q.FailureGroup) && (!bySide || g.Side == q.Side) {
					out = append(out, g)
				}
			}
		}
		return out, fmt.Sprintf("counted %s, refreshed every %s", ago(now.Sub(e.at)), human(c.h.cfg.CacheTTL)), nil
	}
	g, err := c.h.con.GroupCounts(ctx, q, c.h.cfg.ScanLimit)
	note := "exact counts for this filter"
	if q.Unindexed() {
		note = fmt.Sprintf("among the %s newest letters of this selection", commas(int64(c.h.cfg.ScanLimit)))
	}
	return g, note, err
}

// group returns what names a failure group: its pattern, event type and an example error.
func (c *cache) group(ctx context.Context, side string, id int64) groupInfo {
	key := fmt.Sprintf("%s/%d", side, id)
	c.patMu.Lock()
	gi, ok := c.patterns[key]
	c.patMu.Unlock()
	if ok {
		return gi
	}
	if id == 0 {
		return groupInfo{Pattern: "not grouped yet (stored before the console's migration; grouped within a minute)"}
	}
	l, err := c.h.con.GroupExample(ctx, side, id)
	if errors.Is(err, store.ErrNoLetter) {
		return groupInfo{Pattern: "(no letter of this group is left)"}
	}
	if err != nil {
		return groupInfo{Pattern: "(cannot read this group: " + err.Error() + ")"}
	}
	gi = groupInfo{Pattern: store.NormalizeError(l.Reason), EventType: l.EventType, Example: firstLine(l.Reason), Topic: l.Topic}
	c.patMu.Lock()
	if len(c.patterns) < 100000 {
		c.patterns[key] = gi
	}
	c.patMu.Unlock()
	return gi
}
