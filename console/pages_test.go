package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/internal/consoletest"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// get serves a GET as the bearer of token and returns the status and body.
func get(t testing.TB, h http.Handler, path, token string) (int, string) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b)
}

func TestEveryPageRendersUnderItsPrefix(t *testing.T) {
	s := consoletest.OpenStore(t)
	consoletest.Seed(t, s)
	h := consoletest.NewHandler(t, s)
	for _, p := range []string{"/ops/console/", "/ops/console/letters", "/ops/console/letters?side=billing", "/ops/console/letters?side=outbox",
		"/ops/console/letters?q=billing+account", "/ops/console/letters?archived=1", "/ops/console/jobs", "/ops/console/audit",
		"/ops/console/letters/billing/1", "/ops/console/replay/preview?side=outbox", "/ops/console/login"} {
		code, body := get(t, h, p, consoletest.OperatorToken)
		if code != http.StatusOK {
			t.Errorf("%s: %d %s", p, code, body)
			continue
		}
		// Every link, form and asset stays under the prefix (the handler is mounted without StripPrefix).
		for _, attr := range []string{`href="/`, `action="/`, `src="/`} {
			for _, rest := range strings.Split(body, attr)[1:] {
				if !strings.HasPrefix(rest, "ops/console") {
					t.Errorf("%s: a link outside the prefix: %s%.40s", p, attr, rest)
				}
			}
		}
	}
	if code, _ := get(t, h, "/elsewhere", consoletest.OperatorToken); code != http.StatusNotFound {
		t.Errorf("a path outside the prefix: %d, want 404", code)
	}
	if code, body := get(t, h, "/ops/console/letters?from=yesterday", consoletest.OperatorToken); code != http.StatusOK || !strings.Contains(body, "use 2026-12-01 02:30 (UTC)") {
		t.Errorf("a bad time in the filter: %d, says %q", code, between(body, `id="flash">`, "<"))
	}
	code, body := get(t, h, "/ops/console/letters?side=billing&key=order-nothing", consoletest.OperatorToken)
	if code != http.StatusOK || !strings.Contains(body, "Nothing matches this filter.") || !strings.Contains(body, "order-nothing") {
		t.Errorf("a filter that matches nothing: %d, %q", code, between(body, `id="empty">`, "</div>"))
	}
}

func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	s = s[i+len(from):]
	if j := strings.Index(s, to); j >= 0 {
		s = s[:j]
	}
	return s
}

func TestSchemaNotMigratedSaysWhichVersion(t *testing.T) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "empty.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.DB().Close()
	h, err := console.New(console.Config{Store: s, Auth: console.Auth{Tokens: consoletest.Tokens}})
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, h, "/", consoletest.OperatorToken)
	_, newest, _ := s.SchemaVersion(context.Background())
	if code != http.StatusServiceUnavailable || !strings.Contains(body, fmt.Sprintf("needs schema version %d", newest)) || !strings.Contains(body, "outboxctl migrate") {
		t.Fatalf("unmigrated: %d %q", code, between(body, `id="notice"`, "</p>"))
	}
	if code, body := get(t, h, "/healthz", ""); code != http.StatusServiceUnavailable || strings.Contains(body, "version") {
		t.Fatalf("healthz on an unmigrated schema: %d %q (503, no detail)", code, body)
	}
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'from_the_future', '2030-01-01T00:00:00.000000Z')`); err != nil {
		t.Fatal(err)
	}
	h2, _ := console.New(console.Config{Store: s, Auth: console.Auth{Tokens: consoletest.Tokens}})
	if code, body := get(t, h2, "/letters", consoletest.OperatorToken); code != http.StatusServiceUnavailable || !strings.Contains(body, "newer outboxkit (schema version 99)") {
		t.Fatalf("newer schema: %d %q", code, between(body, `id="notice"`, "</p>"))
	}
}

func TestDetailShowsJSONHexAndTruncatesAHugePayload(t *testing.T) {
	s := consoletest.OpenStore(t)
	consoletest.Seed(t, s)
	h := consoletest.NewHandler(t, s)
	c := store.Console(s.Store)
	find := func(id string) store.DeadLetter {
		page, err := c.ListDeadLetters(context.Background(), store.LetterQuery{Side: "search", Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range page.Letters {
			if strings.HasSuffix(l.MessageID, id) {
				return l
			}
		}
		t.Fatalf("no letter %s", id)
		return store.DeadLetter{}
	}
	bin := find("binary000001")
	_, body := get(t, h, fmt.Sprintf("/ops/console/letters/search/%d", bin.ID), consoletest.ViewerToken)
	if !strings.Contains(body, "not valid UTF-8: shown as hex") || !strings.Contains(body, "00000000  ff fe 00 62 69 6e") {
		t.Fatalf("a non-UTF-8 payload: %q", between(body, `id="payload"`, "</pre>"))
	}
	huge := find("huge00000001")
	_, body = get(t, h, fmt.Sprintf("/ops/console/letters/search/%d", huge.ID), consoletest.ViewerToken)
	if !strings.Contains(body, "Shown: the first 64 KiB") || len(body) > 200<<10 {
		t.Fatalf("a 200 KiB payload: page of %d bytes, truncation said: %v", len(body), strings.Contains(body, "Shown: the first 64 KiB"))
	}
	r := httptest.NewRequest("GET", fmt.Sprintf("/ops/console/letters/search/%d/payload", huge.ID), nil)
	r.Header.Set("Authorization", "Bearer "+consoletest.ViewerToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || w.Body.Len() != huge.PayloadSize || !strings.HasPrefix(w.Header().Get("Content-Disposition"), "attachment") ||
		w.Header().Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("download: %d, %d bytes of %d, %v", w.Code, w.Body.Len(), huge.PayloadSize, w.Header())
	}
	billing, err := c.ListDeadLetters(context.Background(), store.LetterQuery{Side: "billing", PartitionKey: "order-00100", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, body = get(t, h, fmt.Sprintf("/ops/console/letters/billing/%d", billing.Letters[0].ID), consoletest.ViewerToken)
	for _, want := range []string{`<span class="jk">"customer"</span>`, "4bf92f3577b34da6a3ce929d0e0e4736", "letters share this cause"} {
		if !strings.Contains(body, want) {
			t.Errorf("the detail of a JSON letter lacks %q", want)
		}
	}
	hidden := consoletest.NewHandler(t, s, func(c *console.Config) { c.HidePayloads = true })
	_, body = get(t, hidden, fmt.Sprintf("/ops/console/letters/billing/%d", billing.Letters[0].ID), consoletest.ViewerToken)
	if strings.Contains(body, "c-0042\",") || strings.Contains(body, "total_cents") || !strings.Contains(body, "Payloads are hidden") {
		t.Fatal("HidePayloads: the payload is on the page")
	}
	if code, _ := get(t, hidden, fmt.Sprintf("/ops/console/letters/billing/%d/payload", billing.Letters[0].ID), consoletest.ViewerToken); code != http.StatusNotFound {
		t.Fatalf("HidePayloads: the download answered %d, want 404", code)
	}
}

// A POST needs the form's CSRF token unless it carries a bearer token; a viewer is refused an
// operator's action, and the refusal is audited.
func TestRolesAndCSRF(t *testing.T) {
	s := consoletest.OpenStore(t)
	consoletest.Seed(t, s)
	h := consoletest.NewHandler(t, s)
	post := func(token, csrfCookie, csrf string, form url.Values) *httptest.ResponseRecorder {
		if csrf != "" {
			form.Set("csrf", csrf)
		}
		r := httptest.NewRequest("POST", "/ops/console/topics/shop.orders/pause", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		if csrfCookie != "" {
			r.AddCookie(&http.Cookie{Name: "obk_csrf", Value: csrfCookie})
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// A session without the form's token: refused.
	sess := login(t, h, consoletest.OperatorToken)
	r := httptest.NewRequest("POST", "/ops/console/topics/shop.orders/pause", strings.NewReader(""))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.AddCookie(sess)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "security token") {
		t.Fatalf("a session's POST without the CSRF token: %d", w.Code)
	}
	if w := post(consoletest.ViewerToken, "", "", url.Values{}); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "viewer role") {
		t.Fatalf("a viewer's pause: %d %s", w.Code, w.Body)
	}
	if w := post(consoletest.OperatorToken, "", "", url.Values{}); w.Code != http.StatusSeeOther {
		t.Fatalf("an operator's pause with a bearer token: %d %s", w.Code, w.Body)
	}
	log, err := store.Console(s.Store).AuditLog(context.Background(), 0, 10)
	if err != nil || len(log) != 2 || log[1].Actor != "carol" || log[1].OK || log[0].Actor != "alice" || !log[0].OK {
		t.Fatalf("audit: %+v, %v", log, err)
	}
}

// login signs in through the form and returns the session cookie.
func login(t testing.TB, h http.Handler, token string) *http.Cookie {
	t.Helper()
	code, body := get(t, h, "/ops/console/login", "")
	if code != 200 {
		t.Fatalf("sign-in page: %d", code)
	}
	if strings.Contains(body, "sqlite") || strings.Contains(body, "schema version") {
		t.Fatal("the sign-in page shows the database before anyone signed in")
	}
	r := httptest.NewRequest("GET", "/ops/console/login", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	csrfCookie := w.Result().Cookies()[0]
	csrf := between(w.Body.String(), `name="csrf" value="`, `"`)
	form := url.Values{"token": {token}, "csrf": {csrf}, "next": {"https://evil.example/"}}
	r = httptest.NewRequest("POST", "/ops/console/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.AddCookie(csrfCookie)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ops/console/" {
		t.Fatalf("sign-in: %d to %q (never an open redirect)", w.Code, w.Header().Get("Location"))
	}
	for _, c := range w.Result().Cookies() {
		if c.Name == "obk_session" {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ops/console/" {
				t.Fatalf("session cookie %+v", c)
			}
			return c
		}
	}
	t.Fatal("no session cookie")
	return nil
}

func TestLocalOnlyRefusesRemoteAndProxied(t *testing.T) {
	s := consoletest.OpenStore(t)
	h, err := console.New(console.Config{Store: s, Auth: console.Auth{LocalOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote, forwarded string
		want              int
	}{{"127.0.0.1:5000", "", 200}, {"[::1]:5000", "", 200}, {"10.1.2.3:5000", "", 403}, {"127.0.0.1:5000", "10.1.2.3", 403}} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.forwarded != "" {
			r.Header.Set("X-Forwarded-For", tc.forwarded)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("from %s via %q: %d, want %d", tc.remote, tc.forwarded, w.Code, tc.want)
		}
	}
	err = console.ListenAndServe(context.Background(), "0.0.0.0:0", h, nil)
	if !errors.Is(err, console.ErrNoAuthOnNetwork) {
		t.Fatalf("listening on every interface without credentials: %v", err)
	}
	if _, err := console.New(console.Config{Store: s}); err == nil || !strings.Contains(err.Error(), "no way in") {
		t.Fatalf("a console with no way in: %v", err)
	}
	if _, err := console.New(console.Config{Store: s, Auth: console.Auth{Tokens: []console.Token{{Name: "x", Role: console.Operator, Secret: "short"}}}}); err == nil {
		t.Fatal("a short token secret was accepted")
	}
}

// Replaying a letter already replayed is a no-op that says so.
func TestReplayingTwiceIsANoOpThatSaysSo(t *testing.T) {
	s := consoletest.OpenStore(t)
	consoletest.Seed(t, s)
	h := consoletest.NewHandler(t, s, func(c *console.Config) { c.Publisher = &consoletest.Recorder{} })
	page, err := store.Console(s.Store).ListDeadLetters(context.Background(), store.LetterQuery{Side: "billing", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	act := func(refs ...string) string {
		form := url.Values{"action": {"replay"}, "id": refs}
		r := httptest.NewRequest("POST", "/ops/console/letters/act", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Authorization", "Bearer "+consoletest.OperatorToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		loc, _ := url.Parse(w.Header().Get("Location"))
		if w.Code != http.StatusSeeOther {
			t.Fatalf("act: %d %s", w.Code, w.Body)
		}
		return loc.Query().Get("flash")
	}
	one := fmt.Sprintf("billing:%d", page.Letters[0].ID)
	two := fmt.Sprintf("billing:%d", page.Letters[1].ID)
	if got := act(one); got != "Replayed 1 letter" {
		t.Fatalf("first replay says %q", got)
	}
	if got := act(one, two); got != "Replayed 1 letter · 1 was already replayed or archived: nothing to do" {
		t.Fatalf("replaying one again with another says %q", got)
	}
	if got := act(one); got != "Replayed 0 letters · 1 was already replayed or archived: nothing to do" {
		t.Fatalf("replaying it a third time says %q", got)
	}
}
