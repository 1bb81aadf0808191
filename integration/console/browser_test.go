package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
	"github.com/outboxkit/outboxkit/internal/consoletest"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

var _ = sqlitestore.Open

// site is a seeded console under /ops/console of a test server, and the broker its replays reach.
type site struct {
	base  string
	store *sqlitestore.Store
	pub   *consoletest.Recorder
}

func newSite(t *testing.T, tune ...func(*console.Config)) *site {
	t.Helper()
	s := consoletest.OpenStore(t)
	consoletest.Seed(t, s)
	pub := &consoletest.Recorder{}
	h := consoletest.NewHandler(t, s, append([]func(*console.Config){func(c *console.Config) { c.Publisher = pub; c.CacheTTL = time.Second }}, tune...)...)
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &site{base: srv.URL + "/ops/console", store: s, pub: pub}
}

func signIn(b *browsertest.Tab, base, token string) {
	b.T.Helper()
	b.Go(base+"/", "#token")
	b.Do(chromedp.SendKeys("#token", token))
	b.Click("#signin")
}

// The operator finds Billing's largest failure group from the overview, previews its replay,
// runs the job, watches it finish, and finds it in the audit; the same replay again is refused as
// a no-op. Every page is kept as a screenshot.
func TestOperatorReplaysAFailureGroup(t *testing.T) {
	st := newSite(t, func(c *console.Config) { c.Environment = "production" })
	b := browsertest.NewTab(t)
	b.Go(st.base+"/", "#token")
	b.Shot("00-sign-in")
	signIn(b, st.base, consoletest.OperatorToken)
	if got := b.Text(".verdict"); !strings.Contains(got, "need attention") {
		t.Fatalf("overview verdict = %q", got)
	}
	b.Shot("01-overview")
	b.Dark(true)
	b.Shot("11-overview-dark")
	b.Dark(false)
	b.Click(`.problems a[href$="/letters?side=billing"]`)
	b.Shot("02-dead-letters-billing")
	cause := b.Text("table.groups tbody tr:first-child td.pattern")
	if !strings.Contains(cause, "has no billing account") || !strings.Contains(cause, "‹…›") {
		t.Fatalf("billing's largest group is %q", cause)
	}
	if count := b.Text("table.groups tbody tr:first-child .count"); count != "12" {
		t.Fatalf("the group counts %s letters, want 12", count)
	}
	b.Click("table.groups tbody tr:first-child a.btn:not(.outline)")
	b.Shot("03-failure-group")
	if got := b.Text("#total"); got != "12 letters" {
		t.Fatalf("the group's list says %q", got)
	}
	// A filter inside the group: one key.
	b.Do(chromedp.SendKeys(`input[name=key]`, "order-00105"))
	b.Click(`form.filters button.primary`)
	if got := b.Text("#total"); got != "1 letter" {
		t.Fatalf("the group filtered by key says %q", got)
	}
	b.Click("#list tbody tr:first-child td.num a")
	b.Shot("04-detail-json")
	if got := b.Text("#payload"); !strings.Contains(got, `"customer": "c-0042"`) {
		t.Fatalf("the detail's payload: %q", got)
	}
	b.Dark(true)
	b.Shot("12-detail-dark")
	b.Dark(false)

	b.Go(st.base+"/letters?side=billing", "table.groups")
	b.Click("table.groups tbody tr:first-child a.outline")
	if h := b.Text("h1"); !strings.Contains(h, "Replay 12 dead letters?") {
		t.Fatalf("preview heading = %q", h)
	}
	b.Shot("06-replay-preview")
	b.Do(chromedp.SetValue(`select[name=rate]`, "1000"))
	b.Click("#start")
	b.WaitFor(`document.querySelector("#state") && document.querySelector("#state").textContent.includes("done")`, 30*time.Second)
	b.Shot("07-job-done")
	if done := b.Text("#done"); done != "12" {
		t.Fatalf("the job finished with %s done, want 12", done)
	}
	sent := st.pub.Sent()
	if len(sent) != 12 {
		t.Fatalf("the broker got %d messages, want the group's 12", len(sent))
	}
	for _, m := range sent {
		if m.Metadata.Get(outboxkit.MetadataReplay) == "" || !strings.HasPrefix(m.UUID, "0190f7e2-0000-7000-8000-") {
			t.Fatalf("a replayed message keeps its id and carries a replay token: %s %v", m.UUID, m.Metadata)
		}
	}
	// In each key's order: the source seqs the relay stamped, ascending.
	for i := 1; i < len(sent); i++ {
		if sent[i].Metadata.Get(outboxkit.MetadataSeq) < sent[i-1].Metadata.Get(outboxkit.MetadataSeq) {
			t.Fatalf("replayed out of order: seq %s after %s", sent[i].Metadata.Get(outboxkit.MetadataSeq), sent[i-1].Metadata.Get(outboxkit.MetadataSeq))
		}
	}
	b.Go(st.base+"/jobs", "#jobs")
	b.Shot("08-jobs")
	b.Go(st.base+"/audit", "table")
	b.Shot("09-audit")
	if row := b.Text("tbody tr:first-child"); !strings.Contains(row, "alice") || !strings.Contains(row, "replay done") || !strings.Contains(row, "12 replayed") {
		t.Fatalf("the audit's newest row = %q", row)
	}
	// The same group again: nothing waits any more, and the preview says so.
	b.Go(st.base+"/letters?side=billing", "#list")
	if strings.Contains(b.Text("table.groups"), "has no billing account") {
		t.Fatal("the replayed group is still listed")
	}
	b.Go(st.base+"/letters?side=billing&key=nobody-has-this-key&q=nothing+like+this", "#empty")
	b.Shot("10-no-match")
	if got := b.Text("#empty"); !strings.Contains(got, "Nothing matches") {
		t.Fatalf("a filter that matches nothing says %q", got)
	}
}

func TestDetailOfANonUTF8Payload(t *testing.T) {
	st := newSite(t)
	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.ViewerToken)
	page, err := store.Console(st.store.Store).ListDeadLetters(context.Background(), store.LetterQuery{Side: "search", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range page.Letters {
		if strings.HasSuffix(l.MessageID, "binary000001") {
			b.Go(fmt.Sprintf("%s/letters/search/%d", st.base, l.ID), "#payload")
			b.Shot("05-detail-hex")
			if got := b.Text("#payload"); !strings.Contains(got, "ff fe 00 62 69 6e") {
				t.Fatalf("hex dump = %q", got)
			}
			return
		}
	}
	t.Fatal("no non-UTF-8 letter")
}

// A viewer sees no action controls, and a replay posted anyway — same origin, the viewer's own
// valid CSRF token — is refused and audited.
func TestViewerIsRefusedTheReplay(t *testing.T) {
	st := newSite(t)
	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.ViewerToken)
	b.Go(st.base+"/letters?side=billing", "#list")
	b.Shot("viewer-letters")
	if n := browsertest.Eval[int](b, `document.querySelectorAll("button[value=replay], a.outline, input[name=id], #replay-all").length`); n != 0 {
		t.Fatalf("a viewer sees %d action controls", n)
	}
	status := browsertest.Eval[float64](b, `(() => { const csrf = document.querySelector("input[name=csrf]").value;
		return fetch("letters/act", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
		  body: "csrf=" + encodeURIComponent(csrf) + "&action=replay&id=billing:1"}).then(r => r.status); })()`)
	if status != http.StatusForbidden {
		t.Fatalf("a viewer's replay: %v, want 403", status)
	}
	if n := len(st.pub.Sent()); n != 0 {
		t.Fatalf("a viewer's refused replay sent %d messages", n)
	}
	b.Go(st.base+"/audit", "table")
	if row := b.Text("tbody tr:first-child"); !strings.Contains(row, "carol") || !strings.Contains(row, "refused") {
		t.Fatalf("the audit's newest row = %q, want carol's refusal", row)
	}
}

// An operator's POST without the form's token is refused, and so is a form another site posts
// with the operator's cookies.
func TestPostWithoutCSRFTokenIsRefused(t *testing.T) {
	st := newSite(t)
	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.OperatorToken)
	b.Go(st.base+"/letters", "#list")
	status := browsertest.Eval[float64](b, `fetch("letters/act", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
		body: "action=replay&id=billing:1"}).then(r => r.status)`)
	if status != http.StatusForbidden {
		t.Fatalf("a POST without the token: %v, want 403", status)
	}
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = fmt.Fprintf(w, `<form method=post action="%s/topics/shop.orders/pause"><input name=csrf value=x><button id=go>win a prize</button></form>`, st.base)
	}))
	defer evil.Close()
	b.Go(evil.URL+"/", "#go")
	b.Click("#go")
	if got := b.Text("#refused"); !strings.Contains(got, "another site") && !strings.Contains(got, "security token") {
		t.Fatalf("a cross-site POST answered %q", got)
	}
	if ps, _ := store.Console(st.store.Store).Pauses(context.Background()); len(ps) != 0 {
		t.Fatalf("a cross-site form paused %+v", ps)
	}
}

// An operator pauses a topic from the overview; a running relay acknowledges it at its next
// heartbeat; resumed, it flows again. Selected letters are archived from the list and shown
// among the archived ones.
func TestPauseAndArchiveFromThePages(t *testing.T) {
	st := newSite(t)
	f, err := forwarder.New(forwarder.Config{Store: st.store, Name: "demo", Publisher: &consoletest.Recorder{}, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	con := store.Console(st.store.Store)
	testenv.Eventually(t, 15*time.Second, "the relay's first heartbeat", func() bool { r, _ := con.Relays(context.Background()); return len(r) == 1 })

	b := browsertest.NewTab(t)
	signIn(b, st.base, consoletest.OperatorToken)
	if got := b.Text("#relays tbody"); !strings.Contains(got, "demo") || !strings.Contains(got, "running") {
		t.Fatalf("relays: %q", got)
	}
	b.Click(`#topics form[action$="/topics/shop.orders/pause"] button`)
	if got := b.Text("#flash"); !strings.Contains(got, "shop.orders paused") {
		t.Fatalf("pausing says %q", got)
	}
	ps, err := con.Pauses(context.Background())
	if err != nil || len(ps) != 1 || ps[0].By != "alice" {
		t.Fatalf("pauses: %+v, %v", ps, err)
	}
	// The overview refreshes itself (console.js fetches its live region every 10 s): the relay's
	// acknowledgement appears without a reload.
	b.WaitFor(`document.querySelector("#topics").textContent.includes("acknowledged by demo")`, 30*time.Second)
	b.Shot("13-overview-paused")
	b.Click(`#topics form[action$="/topics/shop.orders/resume"] button`)
	if got := b.Text("#flash"); !strings.Contains(got, "resumed") {
		t.Fatalf("resuming says %q", got)
	}

	b.Go(st.base+"/letters?side=search", "#list")
	b.Do(chromedp.Click(`#list tbody tr:first-child input[name=id]`))
	b.Click(`button[value=archive]`)
	if got := b.Text("#flash"); got != "Archived 1 letter" {
		t.Fatalf("archiving the selected letter says %q", got)
	}
	b.Go(st.base+"/letters?side=search&archived=1", "#list")
	b.Shot("14-archived")
	if got := b.Text("#total"); got != "1 letter" {
		t.Fatalf("archived list: %q", got)
	}
}
