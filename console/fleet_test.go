package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/internal/consoletest"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

type testFleet struct {
	coord   *sqlitestore.Store
	fc      store.FleetControl
	catalog fleet.Outboxes
}

const globexReason = consoletest.GlobexReason

// newTestFleet is consoletest's fleet, its catalog the test's to change before handler.
func newTestFleet(t *testing.T) *testFleet {
	t.Helper()
	f := consoletest.SeedFleet(t)
	return &testFleet{coord: f.Coord, fc: f.Control, catalog: f.Catalog}
}

func (tf *testFleet) handler(t *testing.T, tune ...func(*console.FleetConfig)) *console.Handler {
	t.Helper()
	f := &consoletest.Fleet{Coord: tf.coord, Control: tf.fc, Catalog: tf.catalog}
	return f.Handler(t, tune...)
}

var outboxRow = regexp.MustCompile(`<tr class="(\w+)" data-outbox="([^"]+)">`)

// rows lists the fleet page's outboxes, in order, as state:name.
func rows(body string) []string {
	var out []string
	for _, m := range outboxRow.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1]+":"+m[2])
	}
	return out
}

// linksUnder reports every link, form and asset of body outside prefix.
func linksUnder(t *testing.T, page, body, prefix string) {
	t.Helper()
	for _, attr := range []string{`href="`, `action="`, `src="`} {
		for _, rest := range strings.Split(body, attr)[1:] {
			if !strings.HasPrefix(rest, prefix) {
				t.Errorf("%s: a link outside %s: %s%.40s", page, prefix, attr, rest)
			}
		}
	}
}

func TestFleetPageListsTheUnownedOutboxFirst(t *testing.T) {
	tf := newTestFleet(t)
	h := tf.handler(t)
	code, body := get(t, h, "/ops/", consoletest.ViewerToken)
	if code != http.StatusOK {
		t.Fatalf("fleet page: %d %s", code, body)
	}
	if got, want := strings.Join(rows(body), " "), "unowned:initech owned:acme owned:globex-eu"; got != want {
		t.Fatalf("the fleet page lists %q, want %q", got, want)
	}
	if v := between(body, `id="verdict">`, "</div>"); !strings.Contains(v, "1 outbox has no owner") {
		t.Errorf("verdict: %q", v)
	}
	for _, want := range []string{`href="/ops/t/acme/"`, `href="/ops/t/globex/"`, `href="/ops/t/initech/"`, "outbox globex-eu", "relay-1", "host-1 · pid 101",
		"1 m 30 s" /* acme's oldest pending */, `<option value="globex">`} {
		if !strings.Contains(body, want) {
			t.Errorf("the fleet page does not show %q", want)
		}
	}
	linksUnder(t, "/ops/", body, "/ops/")

	// The filter: a substring of the tenant, any case.
	_, body = get(t, h, "/ops/?q=GLOB", consoletest.ViewerToken)
	if got := strings.Join(rows(body), " "); got != "owned:globex-eu" {
		t.Errorf("filtered by GLOB: %q", got)
	}
	if v := between(body, `id="verdict">`, "</div>"); !strings.Contains(v, "1 outbox has no owner") {
		t.Errorf("the verdict is the whole fleet's, whatever the filter: %q", v)
	}
	_, body = get(t, h, "/ops/?q=nothing-like-it", consoletest.ViewerToken)
	if !strings.Contains(body, `id="no-outbox"`) || !strings.Contains(body, "nothing-like-it") {
		t.Errorf("a filter that matches nothing: %q", between(body, `<tbody>`, "</tbody>"))
	}

	// Live regions refresh themselves: each fragment renders alone.
	for _, frag := range []string{"summary", "outboxes"} {
		r := httptest.NewRequest("GET", "/ops/", nil)
		r.Header.Set("Authorization", "Bearer "+consoletest.ViewerToken)
		r.Header.Set("X-Console-Fragment", frag)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || strings.Contains(w.Body.String(), "<html") {
			t.Errorf("fragment %s: %d, a whole page: %t", frag, w.Code, strings.Contains(w.Body.String(), "<html"))
		}
	}
}

// An outbox in the catalog that no member recorded (no member runs with it) has no owner either.
func TestFleetPageShowsACatalogOutboxNoMemberRecorded(t *testing.T) {
	tf := newTestFleet(t)
	tf.catalog = append(tf.catalog, fleet.Outbox{Name: "hooli", URL: tf.catalog[2].URL})
	h := tf.handler(t)
	_, body := get(t, h, "/ops/", consoletest.ViewerToken)
	if got, want := strings.Join(rows(body), " "), "unowned:hooli unowned:initech owned:acme owned:globex-eu"; got != want {
		t.Fatalf("the fleet page lists %q, want %q", got, want)
	}
	if !strings.Contains(body, "no member has recorded it") || !strings.Contains(body, "1 never recorded by a member") {
		t.Errorf("the unrecorded outbox is not said to be so: %q", between(body, `data-outbox="hooli">`, "</tr>"))
	}
}

func TestFleetTenantPagesShowThatTenantsStore(t *testing.T) {
	tf := newTestFleet(t)
	h := tf.handler(t)
	code, body := get(t, h, "/ops/t/acme/letters?side=billing", consoletest.ViewerToken)
	if code != http.StatusOK {
		t.Fatalf("acme's letters: %d %s", code, body)
	}
	if !strings.Contains(body, "has no billing account") || strings.Contains(body, globexReason) {
		t.Errorf("acme's dead letters: billing's group %t, globex's letter %t", strings.Contains(body, "has no billing account"), strings.Contains(body, globexReason))
	}
	if got := between(body, `id="tenant-name">`, "<"); got != "acme" {
		t.Errorf("the header names tenant %q", got)
	}
	if !strings.Contains(body, `id="fleet-link"`) || !strings.Contains(body, `href="/ops/"`) {
		t.Error("no link back to the fleet")
	}
	if !strings.Contains(body, `action="/ops/t"`) || !strings.Contains(body, `name="at" value="/letters"`) {
		t.Error("no tenant switcher keeping the page")
	}
	linksUnder(t, "acme's letters", body, "/ops/")

	code, body = get(t, h, "/ops/t/globex/letters", consoletest.ViewerToken)
	if code != http.StatusOK || !strings.Contains(body, globexReason) || strings.Contains(body, "has no billing account") {
		t.Errorf("globex's dead letters: %d, its letter %t, acme's %t", code, strings.Contains(body, globexReason), strings.Contains(body, "has no billing account"))
	}
	if !strings.Contains(body, "outbox globex-eu") {
		t.Error("globex's header does not name its outbox")
	}
	// Every page of the console, for a tenant.
	for _, p := range []string{"/ops/t/acme/", "/ops/t/acme/jobs", "/ops/t/acme/audit", "/ops/t/acme/letters/billing/1", "/ops/t/globex/"} {
		if code, body := get(t, h, p, consoletest.OperatorToken); code != http.StatusOK {
			t.Errorf("%s: %d %.200s", p, code, body)
		} else {
			linksUnder(t, p, body, "/ops/")
		}
	}

	// One address per console: the outbox's name goes to its tenant's.
	if code, loc := redirect(t, h, "/ops/t/globex-eu/letters?side=shipping"); code != http.StatusTemporaryRedirect || loc != "/ops/t/globex/letters?side=shipping" {
		t.Errorf("by the outbox's name: %d to %q", code, loc)
	}
	if code, loc := redirect(t, h, "/ops/t?tenant=globex&at=/letters"); code != http.StatusSeeOther || loc != "/ops/t/globex/letters" {
		t.Errorf("the switcher: %d to %q", code, loc)
	}
	if code, loc := redirect(t, h, "/ops/t?tenant=glo&at=https://evil.example/"); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ops/?") || !strings.Contains(loc, "q=glo") {
		t.Errorf("the switcher, no such tenant: %d to %q", code, loc)
	}
}

// redirect serves a GET as the operator and returns the status and the Location.
func redirect(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	r.Header.Set("Authorization", "Bearer "+consoletest.OperatorToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Header().Get("Location")
}

func TestFleetUnknownTenantIsNotFound(t *testing.T) {
	tf := newTestFleet(t)
	h := tf.handler(t)
	for _, p := range []string{"/ops/t/nobody/", "/ops/t/nobody/letters", "/ops/t/~AAA/"} {
		code, body := get(t, h, p, consoletest.ViewerToken)
		if code != http.StatusNotFound || !strings.Contains(body, "No tenant") || !strings.Contains(body, "fleet shop") {
			t.Errorf("%s: %d %q", p, code, between(body, "<h1>", "</h1>"))
		}
	}
	if code, body := get(t, h, "/ops/t/nobody/", consoletest.ViewerToken); !strings.Contains(body, `href="/ops/?q=nobody"`) {
		t.Errorf("the 404 page (%d) does not offer the fleet page filtered: %q", code, between(body, `id="notice"`, "</section>"))
	}
}

func TestFleetAuthAppliesToEveryRoute(t *testing.T) {
	tf := newTestFleet(t)
	opened := 0
	var mu sync.Mutex
	h := tf.handler(t, func(c *console.FleetConfig) {
		c.Open = func(ctx context.Context, o fleet.Outbox) (fleet.Opened, error) {
			mu.Lock()
			opened++
			mu.Unlock()
			db, err := store.Open(ctx, o.URL, store.OpenOptions{MustExist: true})
			if err != nil {
				return fleet.Opened{}, err
			}
			return fleet.Opened{Store: db, Close: db.Close}, nil
		}
	})
	for _, p := range []string{"/ops/", "/ops/t/acme/", "/ops/t/acme/letters?side=billing", "/ops/t/nobody/", "/ops/t?tenant=acme"} {
		r := httptest.NewRequest("GET", p, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/ops/login?next=") {
			t.Errorf("%s without credentials: %d to %q, want the sign-in page", p, w.Code, w.Header().Get("Location"))
		}
		if code, _ := get(t, h, p, "not-a-token-of-anyone-at-all"); code == http.StatusOK || code == http.StatusNotFound {
			t.Errorf("%s with a wrong token: %d", p, code)
		}
	}
	if opened != 0 {
		t.Errorf("requests nobody signed in for opened %d tenant stores", opened)
	}
	// A viewer may look, not act, on a tenant's console: refused by the tenant's console, and
	// audited in the tenant's own database.
	r := httptest.NewRequest("POST", "/ops/t/acme/topics/shop.orders/pause", strings.NewReader(""))
	r.Header.Set("Authorization", "Bearer "+consoletest.ViewerToken)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "viewer role") {
		t.Fatalf("a viewer pausing a topic of acme: %d %q", w.Code, w.Body.String())
	}
	_, body := get(t, h, "/ops/t/acme/audit", consoletest.ViewerToken)
	if !strings.Contains(between(body, "<tbody>", "</tr>"), "carol") {
		t.Errorf("acme's audit does not show carol's refusal: %q", between(body, "<tbody>", "</tr>"))
	}
	_, body = get(t, h, "/ops/t/globex/audit", consoletest.ViewerToken)
	if strings.Contains(between(body, "<tbody>", "</tbody>"), "carol") {
		t.Error("globex's audit shows acme's refusal")
	}
}

// One sign-in at the fleet's page serves every tenant's console: its session and CSRF cookies
// are the fleet's.
func TestFleetOneSignInServesEveryTenant(t *testing.T) {
	tf := newTestFleet(t)
	h := tf.handler(t)
	srv := httptest.NewServer(h)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	read := func(resp *http.Response, err error) (int, string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := read(c.Get(srv.URL + "/ops/t/acme/letters"))
	if code != http.StatusOK || !strings.Contains(body, `id="token"`) {
		t.Fatalf("a tenant's page before signing in: %d, sign-in form %t", code, strings.Contains(body, `id="token"`))
	}
	csrf := between(body, `name="csrf" value="`, `"`)
	next := between(body, `name="next" value="`, `"`)
	form := url.Values{"csrf": {csrf}, "token": {consoletest.OperatorToken}, "next": {strings.ReplaceAll(next, "&amp;", "&")}}
	req, _ := http.NewRequest("POST", srv.URL+"/ops/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	code, body = read(c.Do(req))
	if code != http.StatusOK || !strings.Contains(body, `id="tenant-name">acme<`) {
		t.Fatalf("signed in, back at acme's letters: %d %q", code, between(body, "<h1>", "</h1>"))
	}
	// An action on a tenant, with the form's token from the tenant's page.
	_, body = read(c.Get(srv.URL + "/ops/t/globex/"))
	csrf = between(body, `name="csrf" value="`, `"`)
	req, _ = http.NewRequest("POST", srv.URL+"/ops/t/globex/topics/shop.orders/pause", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	code, body = read(c.Do(req))
	if code != http.StatusOK || !strings.Contains(body, "shop.orders paused") {
		t.Fatalf("pausing a topic of globex: %d %q", code, between(body, `id="flash">`, "<"))
	}
	// Signing out on a tenant's page signs out of the fleet.
	_, body = read(c.Get(srv.URL + "/ops/t/acme/"))
	req, _ = http.NewRequest("POST", srv.URL+"/ops/t/acme/logout", strings.NewReader(url.Values{"csrf": {between(body, `name="csrf" value="`, `"`)}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	if code, body = read(c.Do(req)); code != http.StatusOK || !strings.Contains(body, `id="token"`) {
		t.Fatalf("signing out: %d, sign-in form %t", code, strings.Contains(body, `id="token"`))
	}
	if code, body = read(c.Get(srv.URL + "/ops/")); !strings.Contains(body, `id="token"`) {
		t.Fatalf("the fleet's page after signing out on a tenant's: %d, sign-in form %t", code, strings.Contains(body, `id="token"`))
	}
	for name, want := range map[string]int{"globex": 1, "acme": 0} {
		s, _ := sqlitestore.Open(context.Background(), strings.TrimPrefix(tf.catalog[map[string]int{"acme": 0, "globex": 1}[name]].URL, "sqlite://"))
		ps, err := store.Console(s).Pauses(context.Background())
		_ = s.DB().Close()
		if err != nil || len(ps) != want {
			t.Errorf("%s's pauses: %+v %v, want %d", name, ps, err, want)
		}
	}
}

// Past MaxOpen, the console used least lately is closed, and Stop closes the rest.
func TestFleetKeepsAtMostMaxOpenTenantsOpen(t *testing.T) {
	tf := newTestFleet(t)
	var mu sync.Mutex
	opens, closes := map[string]int{}, map[string]int{}
	h, err := console.NewFleet(console.FleetConfig{Coordination: tf.coord, Fleet: "shop", Catalog: tf.catalog, Prefix: "/ops", MaxOpen: 1,
		Auth: console.Auth{Tokens: consoletest.Tokens},
		Open: func(ctx context.Context, o fleet.Outbox) (fleet.Opened, error) {
			db, err := store.Open(ctx, o.URL, store.OpenOptions{MustExist: true})
			if err != nil {
				return fleet.Opened{}, err
			}
			mu.Lock()
			opens[o.Name]++
			mu.Unlock()
			return fleet.Opened{Store: db, Close: func() error {
				mu.Lock()
				closes[o.Name]++
				mu.Unlock()
				return db.Close()
			}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/ops/t/acme/", "/ops/t/acme/letters", "/ops/t/globex/", "/ops/t/acme/jobs"} {
		if code, _ := get(t, h, p, consoletest.ViewerToken); code != http.StatusOK {
			t.Fatalf("%s: %d", p, code)
		}
	}
	mu.Lock()
	got := fmt.Sprintf("opened %v, closed %v", opens, closes)
	mu.Unlock()
	if want := "opened map[acme:2 globex-eu:1], closed map[acme:1 globex-eu:1]"; got != want {
		t.Errorf("%s, want %s", got, want)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got = fmt.Sprintf("opened %v, closed %v", opens, closes)
	mu.Unlock()
	if want := "opened map[acme:2 globex-eu:1], closed map[acme:2 globex-eu:1]"; got != want {
		t.Errorf("after Stop: %s, want %s", got, want)
	}
	if code, _ := get(t, h, "/ops/t/acme/", consoletest.ViewerToken); code != http.StatusServiceUnavailable {
		t.Errorf("a tenant's page after Stop: %d, want 503", code)
	}
}

// Five hundred outboxes and more: the page lists a bounded number, the unowned first, and pages on.
func TestFleetPageIsPaged(t *testing.T) {
	tf := newTestFleet(t)
	ctx := context.Background()
	var many []store.FleetOutbox
	for i := range 520 {
		name := fmt.Sprintf("tenant-%03d", i)
		tf.catalog = append(tf.catalog, fleet.Outbox{Name: name, URL: "sqlite:///nowhere/" + name + ".db"})
		many = append(many, store.FleetOutbox{Name: name, Tenant: name})
		if i%2 == 0 {
			if _, ok, err := tf.fc.AcquireLease(ctx, "shop", name, "relay-1", time.Hour); err != nil || !ok {
				t.Fatalf("acquire %s: %v %v", name, ok, err)
			}
		}
	}
	if err := tf.fc.RecordFleetOutboxes(ctx, "shop", "relay-1", many, time.Hour); err != nil {
		t.Fatal(err)
	}
	h := tf.handler(t)
	_, body := get(t, h, "/ops/", consoletest.ViewerToken)
	r := rows(body)
	if len(r) != console.DefaultFleetPageSize || r[0] != "unowned:initech" || r[1] != "unowned:tenant-001" {
		t.Fatalf("page 1: %d rows, from %v", len(r), r[:min(3, len(r))])
	}
	if got := between(body, `id="shown">`, "</span>"); !strings.HasPrefix(got, "1–100 of 523 outboxes") {
		t.Errorf("page 1 says %q", got)
	}
	if !strings.Contains(body, `href="/ops/?page=2" id="next"`) {
		t.Error("page 1 has no link to the next")
	}
	_, body = get(t, h, "/ops/?page=6", consoletest.ViewerToken)
	if r := rows(body); len(r) != 23 || !strings.Contains(body, `id="prev"`) || strings.Contains(body, `id="next"`) {
		t.Errorf("the last page: %d rows", len(r))
	}
	_, body = get(t, h, "/ops/?q=tenant-01&page=1", consoletest.ViewerToken)
	if got := between(body, `id="shown">`, "</span>"); !strings.HasPrefix(got, "1–10 of 10 outboxes") {
		t.Errorf("filtered by tenant-01: %q", got)
	}
}

func TestNewFleetNamesTheBadField(t *testing.T) {
	tf := newTestFleet(t)
	for _, c := range []struct {
		cfg  console.FleetConfig
		want string
	}{
		{console.FleetConfig{Fleet: "shop", Catalog: tf.catalog, Auth: console.Auth{LocalOnly: true}}, "field Coordination is required"},
		{console.FleetConfig{Coordination: tf.coord, Catalog: tf.catalog, Auth: console.Auth{LocalOnly: true}}, "field Fleet is required"},
		{console.FleetConfig{Coordination: tf.coord, Fleet: "shop", Auth: console.Auth{LocalOnly: true}}, "field Catalog is required"},
		{console.FleetConfig{Coordination: tf.coord, Fleet: "shop", Catalog: tf.catalog}, "no way in"},
		{console.FleetConfig{Coordination: tf.coord, Fleet: "shop", Catalog: tf.catalog, Auth: console.Auth{LocalOnly: true},
			Console: console.Config{Prefix: "/x"}}, "Console.Store, Console.Prefix and Console.Auth must be empty"},
		{console.FleetConfig{Coordination: tf.coord, Fleet: "shop", Catalog: tf.catalog, Auth: console.Auth{LocalOnly: true},
			Console: console.Config{PageSize: 500}}, "field PageSize must be within 1..200"},
	} {
		if _, err := console.NewFleet(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.want, err)
		}
	}
}
