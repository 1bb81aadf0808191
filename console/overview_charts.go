package console

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"time"
)

// chartTopN is how many topics or consumers a chart draws on their own; the others are summed
// into one series, unless there is only one more.
const chartTopN = 5

// overviewCharts is the overview's "Last hour": a chart per concern, from the history.
type overviewCharts struct {
	Note    string // how the charts are sampled, and since when, if that is less than the hour
	Samples int    // how many samples the history keeps (the page's own figures are not one)
	Figures []template.HTML
}

// charts draws the last hour of the history as of now, and s (the page's own figures) at its
// end; nil when the charts are off.
func (h *Handler) charts(now time.Time, s *snapshot) *overviewCharts {
	every := h.history.every
	if every <= 0 {
		return nil
	}
	samples := h.history.samples(s)
	out := &overviewCharts{Note: fmt.Sprintf("sampled every %s by this console", human(every)), Samples: h.history.count()}
	switch {
	case !h.history.running.Load():
		out.Note = "not sampled: this console was not started (Handler.Start), so the charts show this page's figures alone"
	case len(samples) > 0 && now.Sub(samples[0].at) < historySpan-every:
		out.Note += fmt.Sprintf(", since it started %s", ago(now.Sub(samples[0].at)))
	}
	noData := fmt.Sprintf("No data yet: this console samples every %s and keeps the last hour.", human(every))
	var since time.Time
	if len(samples) > 0 {
		since = samples[0].at
	}
	unknown := "no samples before this console started"
	if !h.history.running.Load() {
		unknown = "not sampled: this console was not started"
	}
	draw := func(c chart) {
		c.Now, c.Span, c.Since, c.Unknown = now, historySpan, since, unknown
		if c.Empty == "" {
			c.Empty = noData
		}
		out.Figures = append(out.Figures, c.svg())
	}

	var topics, consumers []string
	var relays, rated, lagRead, lagged bool
	{
		t, c := map[string]bool{}, map[string]bool{}
		for i := range samples {
			s := &samples[i]
			relays, rated, lagRead = relays || s.relays, rated || s.rated, lagRead || s.lagRead
			for name := range s.topics {
				t[name] = true
			}
			for name, cs := range s.consumers {
				if cs.dead > 0 || cs.hasLag {
					c[name] = true
				}
				lagged = lagged || cs.hasLag
			}
		}
		topics, consumers = keys(t), keys(c)
	}
	// A topic a sample does not list had nothing pending (TopicBacklog lists those that have),
	// and, in a sample with rates, published nothing.
	pendingOf := func(s *sample, name string) float64 { return float64(s.topics[name].pending) }
	rateOf := func(s *sample, name string) float64 {
		if !s.rated {
			return math.NaN()
		}
		return s.topics[name].rate
	}
	deadOf := func(s *sample, name string) float64 { return float64(s.consumers[name].dead) }
	lagOf := func(s *sample, name string) float64 {
		if c, ok := s.consumers[name]; ok && c.hasLag {
			return float64(c.waiting)
		}
		return math.NaN()
	}
	// One line-up of topics and one of consumers for every chart, so that a topic or a consumer
	// has the same colour and dash in each.
	byTopic := lineupOf(topics, "topics", samples, pendingOf, rateOf)
	byConsumer := lineupOf(consumers, "consumers", samples, deadOf, lagOf)

	draw(chart{ID: "chart-pending", Title: "Outbox pending", Sub: "rows waiting to be published, per topic", Unit: "rows", Whole: true,
		Series: byTopic.series(samples, pendingOf)})

	rateEmpty := ""
	switch {
	case len(samples) > 0 && !relays:
		rateEmpty = "No relay has reported a heartbeat in the last hour, and the rate is read from relays' heartbeats."
	case len(samples) > 0 && !rated:
		rateEmpty = fmt.Sprintf("No data yet: a rate takes two samples %s apart, and a relay's heartbeat between them.", human(every))
	}
	var rates []series
	if rated {
		rates = byTopic.series(samples, rateOf)
	}
	draw(chart{ID: "chart-rate", Title: "Publishing", Sub: "rows a second, per topic, from the relays' heartbeats", Unit: "rows/s",
		Series: rates, Empty: rateEmpty})

	var dead []series
	if len(samples) > 0 {
		outbox := series{Name: "outbox", Class: "sx"}
		for i := range samples {
			outbox.Points = append(outbox.Points, point{samples[i].at, float64(samples[i].outboxDead)})
		}
		dead = append([]series{outbox}, byConsumer.series(samples, deadOf)...)
		if len(consumers) == 0 {
			dead = dead[:1] // no consumer has a letter: not one line of zeros for them all
		}
	}
	draw(chart{ID: "chart-dead", Title: "Dead letters waiting", Sub: "letters, the outbox's and each consumer's", Unit: "letters", Whole: true, Series: dead})

	lagEmpty := ""
	switch {
	case len(samples) > 0 && !lagRead:
		lagEmpty = "The broker's backlog is not read: no lag reader is configured (Config.Lag with Config.Consumers, or outboxctl console --broker URL --consumers …)."
	case len(samples) > 0 && !lagged:
		lagEmpty = "The broker's backlog could not be read at any sample of the last hour."
	}
	var lag []series
	if lagged {
		lag = byConsumer.series(samples, lagOf)
	}
	draw(chart{ID: "chart-lag", Title: "Broker backlog", Sub: "messages waiting in the broker, per consumer", Unit: "messages", Whole: true,
		Series: lag, Empty: lagEmpty})
	return out
}

// A lineup is which topics (or consumers) the charts draw on their own, in order, and which they
// sum into one series of "others".
type lineup struct {
	kind string   // "topics", "consumers"
	own  []string // at most chartTopN+1
	rest []string // "" among them: the names a sample folded (foldTopics)
}

// lineupOf ranks names by their largest figure of first in the window, then of second: the
// chartTopN largest are drawn on their own (all of them when there is only one more), the rest
// as one.
func lineupOf(names []string, kind string, samples []sample, first, second func(*sample, string) float64) lineup {
	peak := func(name string, value func(*sample, string) float64) float64 {
		p := math.Inf(-1)
		for i := range samples {
			if v := value(&samples[i], name); !math.IsNaN(v) {
				p = max(p, v)
			}
		}
		return p
	}
	var order []string
	folded := false
	p1, p2 := map[string]float64{}, map[string]float64{}
	for _, n := range names {
		if n == "" {
			folded = true
			continue
		}
		order = append(order, n)
		p1[n], p2[n] = peak(n, first), peak(n, second)
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if p1[a] != p1[b] {
			return p1[a] > p1[b]
		}
		if p2[a] != p2[b] {
			return p2[a] > p2[b]
		}
		return a < b
	})
	l := lineup{kind: kind, own: order}
	if len(order) > chartTopN+1 || (folded && len(order) > chartTopN) {
		l.own, l.rest = order[:chartTopN], order[chartTopN:]
	}
	if folded {
		l.rest = append(l.rest, "")
	}
	return l
}

// series is a series per name of the lineup, a point per sample from value (NaN: no figure),
// and one of the others summed; a series without a figure is left out. With no name at all, it
// is one series "every topic" (or consumer) of value's figures for "" (zeros: nothing).
func (l lineup) series(samples []sample, value func(*sample, string) float64) []series {
	if len(samples) == 0 {
		return nil
	}
	one := l.kind[:len(l.kind)-1]
	if len(l.own) == 0 && len(l.rest) == 0 {
		s := series{Name: "every " + one}
		for i := range samples {
			s.Points = append(s.Points, point{samples[i].at, value(&samples[i], "")})
		}
		return []series{s}
	}
	var out []series
	for i, name := range l.own {
		s := series{Name: name, Class: "s" + strconv.Itoa(i)}
		for j := range samples {
			s.Points = append(s.Points, point{samples[j].at, value(&samples[j], name)})
		}
		out = append(out, s)
	}
	if len(l.rest) > 0 {
		s := series{Name: fmt.Sprintf("%d other %s", len(l.rest), l.kind), Other: true, Class: "so"}
		if len(l.rest) == 1 && l.rest[0] != "" {
			s.Name = "1 other " + one
		}
		for _, name := range l.rest {
			if name == "" { // how many were folded is not known
				s.Name = "other " + l.kind
			}
		}
		for i := range samples {
			sum, ok := 0.0, false
			for _, name := range l.rest {
				if v := value(&samples[i], name); !math.IsNaN(v) {
					sum, ok = sum+v, true
				}
			}
			if !ok {
				sum = math.NaN()
			}
			s.Points = append(s.Points, point{samples[i].at, sum})
		}
		out = append(out, s)
	}
	kept := out[:0]
	for _, s := range out {
		for _, p := range s.Points {
			if !math.IsNaN(p.V) {
				kept = append(kept, s)
				break
			}
		}
	}
	return kept
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
