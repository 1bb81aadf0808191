package console

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

func (h *Handler) overviewPage(w http.ResponseWriter, r *http.Request, id Identity) {
	s, err := h.cache.read(r.Context())
	if err != nil {
		h.failed(w, r, "read the overview", err)
		return
	}
	h.render(w, r, "overview", "Overview", "overview", id, h.buildOverview(r.Context(), s), nil)
}

// groupRows names and sizes failure groups for a table: at most limit, largest first.
func (h *Handler) groupRows(ctx context.Context, groups []store.GroupCount, limit int) []groupRow {
	now := h.cfg.Now()
	var out []groupRow
	var largest int64
	for _, g := range groups {
		largest = max(largest, g.Count)
	}
	for i, g := range groups {
		if limit > 0 && i >= limit {
			break
		}
		gi := h.cache.group(ctx, g.Side, g.FailureGroup)
		row := groupRow{ID: strconv.FormatInt(g.FailureGroup, 10), Side: sideOf(g.Side), EventType: gi.EventType, Pattern: gi.Pattern,
			Example: gi.Example, Count: g.Count, FirstSeen: now.Sub(g.First), LastSeen: now.Sub(g.Last)}
		if largest > 0 {
			row.Share = float64(g.Count) / float64(largest)
		}
		out = append(out, row)
	}
	return out
}

// buildOverview turns a snapshot into the overview page: a verdict, then what needs attention
// most first.
func (h *Handler) buildOverview(ctx context.Context, s *snapshot) overview {
	now := h.cfg.Now()
	ov := overview{CountedAt: s.at, BacklogHeadRows: h.cfg.BacklogHeadRows, PendingCapped: s.backlogCapped}
	paused := map[string]*pause{}
	relayPaused := map[string]*pause{}
	for _, p := range s.pauses {
		pp := &pause{By: p.By, At: p.At, Reason: p.Reason}
		for _, r := range s.relays {
			// A relay acknowledged a pause when it read the pauses after the pause committed: a
			// second after it was stamped, which is before the commit.
			if r.PausesSeen.After(p.At.Add(time.Second)) && now.Sub(r.At) < relayGone {
				pp.AckedBy = append(pp.AckedBy, r.Name+" ("+r.Host+")")
			}
		}
		if len(pp.AckedBy) == 0 {
			pp.AckedBy = []string{"no relay yet (acknowledged at its next heartbeat)"}
		}
		if p.Scope == store.PauseTopic {
			paused[p.Name] = pp
		} else {
			relayPaused[p.Name] = pp
		}
	}
	topics := map[string]*topicRow{}
	topic := func(name string) *topicRow {
		if t, ok := topics[name]; ok {
			return t
		}
		t := &topicRow{Topic: name, Paused: paused[name]}
		topics[name] = t
		return t
	}
	var oldestLive time.Duration
	for _, b := range s.backlog {
		t := topic(b.Topic)
		t.Pending, t.PendingCapped = b.Pending, s.backlogCapped
		t.OldestPending = max(0, now.Sub(b.OldestCreated))
		ov.Pending += b.Pending
		ov.OldestPending = max(ov.OldestPending, t.OldestPending)
		if t.Paused == nil {
			oldestLive = max(oldestLive, t.OldestPending)
		}
	}
	for name := range paused {
		topic(name)
	}
	for t, r := range s.topicRates {
		topic(t).PublishRate = r
	}
	consumers := map[string]*consumerRow{}
	consumer := func(name string) *consumerRow {
		if c, ok := consumers[name]; ok {
			return c
		}
		c := &consumerRow{Consumer: name, Topics: strings.Join(h.cfg.Consumers[name], ", ")}
		consumers[name] = c
		return c
	}
	for name := range h.cfg.Consumers {
		consumer(name)
	}
	var oldestDead time.Duration
	for _, t := range s.totals {
		age := time.Duration(0)
		if !t.Oldest.IsZero() {
			age = max(0, now.Sub(t.Oldest))
		}
		if t.Side == store.SideOutbox {
			topic(t.Topic).DeadLetters += t.Count
			ov.OutboxDead += t.Count
			continue
		}
		c := consumer(t.Side)
		c.DeadLetters, c.OldestDead = t.Count, age
		ov.ConsumerDead += t.Count
		oldestDead = max(oldestDead, age)
	}
	ov.OldestDead = oldestDead
	for _, p := range s.processed {
		consumer(p.Consumer).ProcessedRate = float64(p.Count)
	}
	for name, n := range s.parked {
		consumer(name).Parked = n
	}
	for key, l := range s.lag {
		c := consumer(key[0])
		if l.err != nil {
			continue
		}
		c.HasLag = true
		c.Waiting += l.lag.Waiting
		if l.lag.HasUnacked {
			c.HasUnacked, c.Unacked = true, c.Unacked+l.lag.Unacked
		}
		if l.lag.HasAge {
			c.BrokerOldest = max(c.BrokerOldest, l.lag.OldestAge)
		}
	}
	liveRelays := 0
	for _, b := range s.relays {
		r := relayRow{Name: b.Name, Instance: fmt.Sprintf("%s · pid %d", b.Host, b.PID), Heartbeat: now.Sub(b.At), Paused: relayPaused[b.Name],
			Gone: now.Sub(b.At) > relayGone}
		if !b.LastPass.IsZero() {
			r.LastPass = now.Sub(b.LastPass)
		}
		if !b.LastPublish.IsZero() {
			r.LastPublish = now.Sub(b.LastPublish)
		}
		if !b.CircuitOpenSince.IsZero() {
			r.CircuitOpen, r.CircuitFor = true, now.Sub(b.CircuitOpenSince)
		}
		if !r.Gone {
			liveRelays++
			ov.PublishRate += s.rates[b.Owner]
		}
		ov.Relays = append(ov.Relays, r)
		if r.CircuitOpen && !r.Gone && r.CircuitFor > time.Minute {
			ov.Problems = append(ov.Problems, problem{Severity: sevBad, Subject: "Relay " + b.Name,
				Text: fmt.Sprintf("cannot reach the broker for %s. Its rows wait; no attempt is counted.", human(r.CircuitFor)), Link: "/#relays", Action: "Relays"})
		}
	}
	for _, t := range topics {
		ov.Topics = append(ov.Topics, *t)
	}
	sort.Slice(ov.Topics, func(i, j int) bool { return ov.Topics[i].Topic < ov.Topics[j].Topic })
	for _, c := range consumers {
		ov.Consumers = append(ov.Consumers, *c)
	}
	sort.Slice(ov.Consumers, func(i, j int) bool { return ov.Consumers[i].Consumer < ov.Consumers[j].Consumer })

	// Problems: what to act on first, then what to watch; each names its subject first.
	for _, c := range ov.Consumers {
		if c.DeadLetters > 0 {
			ov.Problems = append(ov.Problems, problem{Severity: sevBad, Subject: c.Consumer,
				Text: fmt.Sprintf("has %s %s waiting; the oldest for %s.", commas(c.DeadLetters), plural(int(min(c.DeadLetters, 2)), "dead letter", "dead letters"), human(c.OldestDead)),
				Link: "/letters?side=" + c.Consumer, Action: "See failure groups"})
		}
	}
	if ov.OutboxDead > 0 {
		ov.Problems = append(ov.Problems, problem{Severity: sevBad, Subject: "The outbox",
			Text: fmt.Sprintf("has %s %s the broker refused.", commas(ov.OutboxDead), plural(int(min(ov.OutboxDead, 2)), "dead letter", "dead letters")),
			Link: "/letters?side=outbox", Action: "See failure groups"})
	}
	if ov.Pending > 0 && liveRelays == 0 {
		ov.Problems = append(ov.Problems, problem{Severity: sevBad, Subject: "No relay",
			Text: fmt.Sprintf("has reported in the last %s while %s rows wait to be published.", human(relayGone), commas(ov.Pending)), Link: "/#relays", Action: "Relays"})
	} else if oldestLive > 5*time.Minute {
		ov.Problems = append(ov.Problems, problem{Severity: sevBad, Subject: "The outbox",
			Text: fmt.Sprintf("holds a row waiting to be published for %s.", human(oldestLive)), Link: "/#topics", Action: "Topics"})
	}
	for _, c := range ov.Consumers {
		if c.HasLag && c.BrokerOldest > time.Minute {
			ov.Problems = append(ov.Problems, problem{Severity: sevWarn, Subject: c.Consumer,
				Text: fmt.Sprintf("is %s messages behind in the broker; the oldest waits %s.", commas(c.Waiting), human(c.BrokerOldest)), Link: "/#consumers", Action: "Consumers"})
		}
	}
	for _, t := range ov.Topics {
		if t.Paused != nil {
			ov.Problems = append(ov.Problems, problem{Severity: sevWarn, Subject: t.Topic,
				Text: fmt.Sprintf("is paused by %s since %s: %s rows wait.", t.Paused.By, ago(now.Sub(t.Paused.At)), commas(t.Pending)), Link: "/#topics", Action: "Topics"})
		}
	}
	for name, p := range relayPaused {
		ov.Problems = append(ov.Problems, problem{Severity: sevWarn, Subject: "Relay " + name,
			Text: fmt.Sprintf("is paused by %s since %s: it publishes nothing.", p.By, ago(now.Sub(p.At))), Link: "/#relays", Action: "Relays"})
	}
	sort.SliceStable(ov.Problems, func(i, j int) bool { return ov.Problems[i].Severity > ov.Problems[j].Severity })
	ov.TopGroups = h.groupRows(ctx, s.groups, 4)
	ov.Charts = h.charts(now, s)
	return ov
}

// relayGone is how long a relay may go without a heartbeat before the console calls it gone.
const relayGone = 15 * time.Second
