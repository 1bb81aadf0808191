package console_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
	"github.com/outboxkit/outboxkit/internal/consoletest"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// testClock is a console's clock (Config.Now) that the test sets.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// topicCounter is the relay's broker: it counts what it was sent, per topic.
type topicCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *topicCounter) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[topic] += int64(len(msgs))
	return nil
}
func (c *topicCounter) Close() error { return nil }

func (c *topicCounter) counts() (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := map[string]int64{}, int64(0)
	for k, v := range c.n {
		out[k], total = v, total+v
	}
	return out, total
}

// brokerLag is the console's Lag func: each consumer's backlog, as the test sets it.
type brokerLag struct {
	mu      sync.Mutex
	waiting map[string]int64
}

func (l *brokerLag) lag(_ context.Context, _, consumer string) (console.Lag, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return console.Lag{Waiting: l.waiting[consumer]}, nil
}

var samplesAttr = regexp.MustCompile(`id="charts" data-samples="(\d+)"`)

// samples is how many samples the overview's charts draw, read as a viewer.
func samples(t *testing.T, base string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Header.Set("Authorization", "Bearer "+consoletest.ViewerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := samplesAttr.FindSubmatch(body)
	if m == nil {
		t.Fatalf("the overview (%d) has no charts", resp.StatusCode)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// The topics of the hour the test plays, with the rows each gets a minute. One is named with
// markup: names are the application's, and the page shows them as text.
var chartTopics = []struct {
	name string
	rows int
}{{"shop.orders", 14}, {"inventory.reserved", 10}, {"shop.payments", 8}, {"inventory.released", 5}, {"mail.<receipts>", 4},
	{"shop.refunds", 3}, {"search.reindex", 2}, {"ops.audit", 1}}

// An hour of an incident, played in 61 steps of a minute on the console's clock: rows flow; the
// broker is down from minute 20 to 35 (nothing is published, the backlog grows, billing
// dead-letters), then the relay catches up and billing's broker backlog follows; the relay
// restarts at minute 45 (a new instance, its counts from zero). The sampler runs every 20 ms of
// real time and samples each snapshot once: a sample a step. The overview then draws the hour:
// four charts, the five largest topics on their own and the other three as one series, every
// name as text, no two labels overlapping; kept as screenshots, light, dark and at 1024 px.
func TestConsoleChartsTheLastHour(t *testing.T) {
	ctx := context.Background()
	end := time.Now().Truncate(time.Second)
	const steps = 61
	start := end.Add(-(steps - 1) * time.Minute)
	clock := &testClock{t: start}
	lag := &brokerLag{waiting: map[string]int64{}}
	st := newSite(t, func(c *console.Config) {
		c.Now, c.ChartInterval, c.Lag = clock.Now, 20*time.Millisecond, lag.lag
	})
	con := store.Console(st.store.Store)
	broker := &topicCounter{n: map[string]int64{}}
	relay, err := forwarder.New(forwarder.Config{Store: st.store, Publisher: broker})
	if err != nil {
		t.Fatal(err)
	}

	owner, started := "relay-1", start.Add(-3*time.Hour)
	base, baseTotal := map[string]int64{}, int64(0) // the broker's counts when the relay (re)started
	var deadSeq int
	var lastOrders, prevOrders int64 // shop.orders published in the last step; before it
	for minute := range steps {
		now := start.Add(time.Duration(minute) * time.Minute)
		down := minute >= 20 && minute < 35
		if minute == 45 { // a new instance, its counts from zero
			owner, started = "relay-2", now.Add(-59*time.Second) // just after the previous sample
			base, baseTotal = broker.counts()
		}
		if !down {
			for range 3 { // the rows of the step before, and after the outage its backlog
				if _, err := relay.DispatchBatch(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		tx, err := st.store.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := pipeline.NewPublisher(st.store, tx, pipeline.PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range chartTopics {
			var msgs []*message.Message
			for k := range int(float64(tp.rows) * (1 + 0.3*math.Sin(float64(minute)/4+float64(len(tp.name))))) {
				msgs = append(msgs, pipeline.NewEvent("Happened", fmt.Sprintf("key-%d", k%7), []byte(`{}`)))
			}
			if err := pub.Publish(tp.name, msgs...); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		counts, total := broker.counts()
		lastOrders = counts["shop.orders"] - prevOrders
		prevOrders = counts["shop.orders"]
		for k := range counts {
			counts[k] -= base[k]
		}
		beat := store.RelayBeat{Owner: owner, Name: "relay", Host: "host-1", PID: 4242, Started: started, At: now, LastPass: now,
			LastPublish: now, PublishedTotal: total - baseTotal, PublishedByTopic: counts, PausesSeen: now}
		if down {
			beat.CircuitOpenSince = start.Add(20 * time.Minute)
		}
		if err := con.RelayHeartbeat(ctx, beat); err != nil {
			t.Fatal(err)
		}
		if minute >= 25 && minute < 40 {
			deadSeq++
			if err := st.store.Session().DeadLetter(ctx, store.InboxDeadLetter{Consumer: "billing", Topic: "shop.orders",
				MessageID: fmt.Sprintf("incident-%04d", deadSeq), Payload: []byte(`{}`), Metadata: []byte(`{"outboxkit_event_type":"OrderPlaced"}`),
				Reason: "billing: upstream timeout after 30s", Deliveries: 5, Now: now}); err != nil {
				t.Fatal(err)
			}
		}
		lag.mu.Lock()
		lag.waiting["shipping"] = int64(8 + 6*math.Sin(float64(minute)/2))
		lag.waiting["search"] = int64(45 + 15*math.Sin(float64(minute)/3))
		lag.waiting["billing"] = 20
		if minute >= 35 && minute < 50 { // the relay's catch-up reaches billing, slower to drain
			lag.waiting["billing"] += int64(2900 * math.Sin(math.Pi*float64(minute-35)/15))
		}
		lag.mu.Unlock()

		clock.Set(now)
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("sample %d", minute+1), func() bool { return samples(t, st.base) >= minute+1 })
	}

	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.OperatorToken)
	b.Go(st.base+"/#charts", "#charts")
	b.Shot("20-overview-charts")
	shotOf(b, "#charts", "21-charts")

	if n := browsertest.Eval[int](b, `document.querySelectorAll("#charts figure.chart > svg[role=img]").length`); n != 4 {
		t.Fatalf("%d charts, want 4", n)
	}
	legend := func(id string) []string {
		return browsertest.Eval[[]string](b, `[...document.querySelectorAll("#`+id+` .chart-legend .name")].map(e => e.textContent)`)
	}
	drawn := func(id string) []string {
		return browsertest.Eval[[]string](b, `[...document.querySelectorAll("#`+id+` svg g.series")].map(e => e.dataset.name)`)
	}
	wantTopics := []string{"shop.orders", "inventory.reserved", "shop.payments", "inventory.released", "mail.<receipts>", "3 other topics"}
	// One line-up for both charts (a topic has one colour), by the largest backlog.
	for _, id := range []string{"chart-pending", "chart-rate"} {
		if got := legend(id); strings.Join(got, "|") != strings.Join(wantTopics, "|") {
			t.Errorf("%s's legend: %q, want %q", id, got, wantTopics)
		}
		if got := drawn(id); len(got) != len(wantTopics) {
			t.Errorf("%s draws %q, want a line for each of %q", id, got, wantTopics)
		}
	}
	if got := legend("chart-dead"); strings.Join(got, "|") != "outbox|billing|search|shipping" {
		t.Errorf("dead letters' legend: %q", got)
	}
	if got := legend("chart-lag"); strings.Join(got, "|") != "billing|search|shipping" {
		t.Errorf("broker backlog's legend: %q", got)
	}
	if n := browsertest.Eval[int](b, `document.querySelectorAll("receipts").length`); n != 0 {
		t.Error("a topic's name was parsed as markup")
	}
	// The rate now: what the broker was sent in the last step, over its minute.
	desc := browsertest.Eval[string](b, `document.querySelector("#chart-rate-desc").textContent`)
	if want := fmt.Sprintf("shop.orders: now %.2f,", float64(lastOrders)/60); !strings.Contains(desc, want) { // below 1: two decimals
		t.Errorf("the rate chart's description: %q, want %q", desc, want)
	}
	if got := b.Text("#charts header"); !strings.Contains(got, "sampled every 20 ms") || strings.Contains(got, "since it started") {
		t.Errorf("a full hour's note: %q", got)
	}
	noOverlaps(b)

	b.Dark(true)
	shotOf(b, "#charts", "22-charts-dark")
	b.Dark(false)
	b.Do(chromedp.EmulateViewport(1024, 900))
	b.Go(st.base+"/#charts", "#charts")
	noOverlaps(b)
	shotOf(b, "#charts", "23-charts-1024")
}

// A console started a moment ago has no sample yet (the first is at the first tick), but the
// page's own figures: the dead letters are dots at "now", the hour before is shaded and said to be
// unsampled, the rate waits for two samples and a heartbeat and says "No data yet", and the note
// says since when it samples. One whose Start was never called says it samples nothing.
func TestConsoleChartsOfAFreshConsole(t *testing.T) {
	st := newSite(t, func(c *console.Config) { // a relay reported before the console started
		con, _ := store.ConsoleOf(c.Store)
		now := time.Now()
		if err := con.RelayHeartbeat(context.Background(), store.RelayBeat{Owner: "relay-1", Name: "relay", Host: "host-1", PID: 4242,
			Started: now.Add(-time.Hour), At: now, PublishedByTopic: map[string]int64{"shop.orders": 1200}, PublishedTotal: 1200}); err != nil {
			t.Fatal(err)
		}
	})
	if n := samples(t, st.base); n != 0 {
		t.Fatalf("%d samples at start, want none before the first tick (20 s)", n)
	}
	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.ViewerToken)
	b.Go(st.base+"/#charts", "#charts")
	shotOf(b, "#charts", "24-charts-fresh")
	if got := browsertest.Eval[string](b, `document.querySelector("#chart-rate svg text.empty").textContent`); !strings.HasPrefix(got, "No data yet: a rate takes two samples 20 s apart") {
		t.Errorf("the rate chart of a fresh console says %q", got)
	}
	if n := browsertest.Eval[int](b, `document.querySelectorAll("#chart-dead svg g.series circle.dot").length`); n == 0 {
		t.Error("one sample of dead letters draws no dot")
	}
	if got := b.Text("#charts header"); !strings.Contains(got, "since it started just now") {
		t.Errorf("a fresh console's note: %q", got)
	}
	if got := browsertest.Eval[string](b, `document.querySelector("#chart-dead svg text.unknown").textContent`); got != "no samples before this console started" {
		t.Errorf("the hour before a fresh console's first sample says %q", got)
	}
	noOverlaps(b)

	s := consoletest.OpenStore(t)
	h, err := console.New(console.Config{Store: s, Prefix: "/ops/console", Auth: console.Auth{Tokens: consoletest.Tokens}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	signIn(b, srv.URL+"/ops/console", consoletest.ViewerToken)
	b.Go(srv.URL+"/ops/console/#charts", "#charts")
	shotOf(b, "#charts", "25-charts-unstarted")
	if got := b.Text("#charts header"); !strings.Contains(got, "not sampled: this console was not started (Handler.Start)") {
		t.Errorf("an unstarted console's note: %q", got)
	}
	if n := browsertest.Eval[int](b, `document.querySelectorAll("#charts svg rect.unknown").length`); n != 4 {
		t.Errorf("%d of an unstarted console's charts shade the hour, want 4", n)
	}
	if got := browsertest.Eval[string](b, `document.querySelector("#chart-dead svg text.unknown").textContent`); got != "not sampled: this console was not started" {
		t.Errorf("an unstarted console's shade says %q", got)
	}
	noOverlaps(b)
}

// noOverlaps fails the test when two labels of a chart overlap, or one leaves its SVG.
func noOverlaps(b *browsertest.Tab) {
	b.T.Helper()
	bad := browsertest.Eval[[]string](b, `(() => {
		const out = [];
		for (const svg of document.querySelectorAll("#charts figure.chart > svg")) {
			const box = svg.getBoundingClientRect();
			const texts = [...svg.querySelectorAll("text")].map(t => [t.textContent, t.getBoundingClientRect()]);
			for (const [s, r] of texts) {
				if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1) out.push(svg.parentElement.id + ": " + s + " leaves the chart");
			}
			for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
				const [a, r] = texts[i], [c, q] = texts[j];
				if (r.left < q.right && q.left < r.right && r.top < q.bottom && q.top < r.bottom) out.push(svg.parentElement.id + ": " + a + " overlaps " + c);
			}
		}
		return out; })()`)
	if len(bad) > 0 {
		b.T.Errorf("chart labels: %q", bad)
	}
}

// shotOf saves a PNG of the element sel matches beside the test's other screenshots.
func shotOf(b *browsertest.Tab, sel, name string) {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.Screenshot(sel))
	if err != nil {
		b.T.Fatalf("screenshot of %s: %v", sel, err)
	}
	if err := os.WriteFile(filepath.Join(browsertest.ArtifactDir(b.T), name+".png"), png, 0o644); err != nil {
		b.T.Fatal(err)
	}
}
