package console

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

var legendNames = regexp.MustCompile(`<li class="(\w+)">.*?<span class="name">([^<]*)</span>`)

func legendOf(fig string) []string {
	var out []string
	for _, m := range legendNames.FindAllStringSubmatch(fig, -1) {
		out = append(out, m[1]+":"+m[2])
	}
	return out
}

// historyOf is a history of n samples a minute apart, to t0, of topics pending i+1 rows each
// (the i-th of them) and consumers with i+1 dead letters.
func historyOf(n, topics, consumers int) *history {
	h := newHistory(20 * time.Second)
	for k := range n {
		s := &snapshot{at: t0.Add(time.Duration(k-n+1) * time.Minute), lag: map[[2]string]lagResult{}}
		for i := range topics {
			s.backlog = append(s.backlog, store.TopicBacklog{Topic: fmt.Sprintf("topic-%d", i), Pending: int64(i + 1)})
		}
		for i := range consumers {
			s.totals = append(s.totals, store.SideTotal{Side: fmt.Sprintf("consumer-%d", i), Count: int64(i + 1)})
			s.lag[[2]string{fmt.Sprintf("consumer-%d", i), "t"}] = lagResult{lag: Lag{Waiting: int64(10 * (i + 1))}}
		}
		h.add(s)
	}
	return h
}

func TestOverviewChartsDrawTheLargestFiveAndTheOthers(t *testing.T) {
	h := &Handler{history: historyOf(10, 8, 3)}
	figs := h.charts(t0, nil).Figures
	if len(figs) != 4 {
		t.Fatalf("%d charts", len(figs))
	}
	want := "s0:topic-7 s1:topic-6 s2:topic-5 s3:topic-4 s4:topic-3 so:3 other topics"
	if got := strings.Join(legendOf(string(figs[0])), " "); got != want {
		t.Errorf("pending's legend: %s, want %s", got, want)
	}
	// The others are summed: topic-0, -1 and -2 pend 1+2+3 rows.
	if !strings.Contains(string(figs[0]), "3 other topics: now 6, at most 6") {
		t.Errorf("the others' sum is not 6: %s", figs[0])
	}
	// The outbox first, in a class of its own; then the consumers, in the same colours as in the
	// broker's backlog.
	if got := strings.Join(legendOf(string(figs[2])), " "); got != "sx:outbox s0:consumer-2 s1:consumer-1 s2:consumer-0" {
		t.Errorf("dead letters' legend: %s", got)
	}
	if got := strings.Join(legendOf(string(figs[3])), " "); got != "s0:consumer-2 s1:consumer-1 s2:consumer-0" {
		t.Errorf("broker backlog's legend: %s", got)
	}
	// Six topics: the sixth is drawn on its own rather than as "1 other".
	figs = (&Handler{history: historyOf(10, 6, 0)}).charts(t0, nil).Figures
	if got := legendOf(string(figs[0])); len(got) != 6 || got[5] != "s5:topic-0" {
		t.Errorf("six topics' legend: %q", got)
	}
	if !strings.Contains(string(figs[2]), `outbox now: <b>0</b> letters`) {
		t.Errorf("no consumer has a letter: the outbox's line alone, %s", figs[2])
	}
}

func TestOverviewChartsOfNoSampleSayNoDataYet(t *testing.T) {
	if (&Handler{history: newHistory(-1)}).charts(t0, nil) != nil {
		t.Error("ChartInterval -1 still charts")
	}
	c := (&Handler{history: newHistory(20 * time.Second)}).charts(t0, nil)
	if c.Samples != 0 || len(c.Figures) != 4 {
		t.Fatalf("%+v", c)
	}
	if !strings.Contains(c.Note, "not sampled: this console was not started") {
		t.Errorf("the note of a console that was not started: %q", c.Note)
	}
	for _, f := range c.Figures {
		if !strings.Contains(string(f), "-desc\">No data yet: this console samples every 20 s and keeps the last hour.</desc>") ||
			!strings.Contains(string(f), `<text class="empty"`) {
			t.Errorf("an empty chart: %s", f)
		}
	}
	// One sample, no relay, no lag reader: each chart says which.
	h := newHistory(20 * time.Second)
	h.running.Store(true) // as Start's loop does
	h.add(&snapshot{at: t0})
	c = (&Handler{history: h}).charts(t0.Add(time.Minute), nil)
	if !strings.Contains(string(c.Figures[1]), "No relay has reported a heartbeat in the last hour") ||
		!strings.Contains(string(c.Figures[3]), "no lag reader is configured") || !strings.Contains(c.Note, "since it started 1 m 0 s ago") {
		t.Errorf("a console of one sample: %s\n%s\n%s", c.Note, c.Figures[1], c.Figures[3])
	}
}

// The page's own figures are the charts' "now" (the tiles and the tables say the same), and are
// not kept: the sampler's next tick takes them.
func TestOverviewChartsEndOnThePagesFigures(t *testing.T) {
	h := &Handler{history: historyOf(10, 1, 1)}
	page := &snapshot{at: t0.Add(15 * time.Second), totals: []store.SideTotal{{Side: "consumer-0", Count: 99}}}
	figs := h.charts(page.at, page).Figures
	if got := strings.Join(legendOf(string(figs[2])), " "); !strings.Contains(string(figs[2]), "consumer-0: now 99, at most 99") || got != "sx:outbox s0:consumer-0" {
		t.Errorf("dead letters now: %s %s", got, figs[2])
	}
	if n := len(h.history.samples(nil)); n != 10 {
		t.Errorf("the page's figures were kept: %d samples", n)
	}
	if n := len(h.history.samples(&snapshot{at: t0})); n != 10 {
		t.Errorf("a snapshot no newer than the last sample is drawn again: %d samples", n)
	}
}
