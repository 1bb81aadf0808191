package console

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

type staticFile struct {
	body []byte
	ct   string
}

// loadAssets reads the embedded CSS and JS under names that carry their hash (so they are cached
// for good and a new release is never served an old one) and parses the templates.
func (h *Handler) loadAssets() error {
	for _, name := range []string{"console.css", "console.js"} {
		b, err := assets.ReadFile("static/" + name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ext := path.Ext(name)
		hashed := strings.TrimSuffix(name, ext) + "." + hex.EncodeToString(sum[:4]) + ext
		ct := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}[ext]
		h.files[hashed] = staticFile{body: b, ct: ct}
		if ext == ".css" {
			h.css = hashed
		} else {
			h.js = hashed
		}
	}
	for _, page := range []string{"overview", "letters", "letter", "preview", "job", "jobs", "audit", "login", "message"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(assets, "templates/layout.tmpl", "templates/groups.tmpl", "templates/"+page+".tmpl")
		if err != nil {
			return fmt.Errorf("parse %s: %w", page, err)
		}
		h.pages[page] = t
	}
	return nil
}

type flash struct {
	Text string
	OK   bool
}

// pageData is what every page's layout reads.
type pageData struct {
	P, Title, Nav, Env, Store, Clock, CSRF, CSS, JS, Kind string
	Who                                                   *Identity
	CanAct                                                bool
	Flash                                                 *flash
	Rates                                                 []int
	Live                                                  int // seconds between refreshes of the live region; 0: none
	Data                                                  any
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, page, title, nav string, id Identity, data any, fl *flash) {
	info := h.db.Info()
	pd := pageData{P: h.cfg.Prefix, Title: title, Nav: nav, Env: h.cfg.Environment, CSS: h.css, JS: h.js,
		Store: fmt.Sprintf("%s · %s · schema version %d", info.Name, info.Schema, h.cache.schemaVersion()),
		Clock: h.cfg.Now().UTC().Format("Mon 2 Jan 15:04:05 UTC"), CSRF: h.csrfToken(w, r), Data: data, Flash: fl,
		CanAct: id.Role >= Operator, Rates: h.rates(), Live: map[string]int{"overview": 10, "job": 1, "jobs": 5}[page]}
	if id.Name != "" {
		pd.Who = &id
	}
	if r.URL.Query().Get("kind") == "archive" {
		pd.Kind = "archive"
	}
	if fl == nil {
		if f := r.URL.Query().Get("flash"); f != "" {
			pd.Flash = &flash{Text: f, OK: r.URL.Query().Get("ok") == "1"}
		}
	}
	t := h.pages[page]
	name := "layout"
	// A live region asks for itself only (console.js): the same data, a fragment of the page.
	if frag := r.Header.Get("X-Console-Fragment"); frag != "" {
		if t.Lookup(frag+"-live") == nil {
			http.Error(w, "no such fragment", http.StatusNotFound)
			return
		}
		name = frag + "-live"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, pd); err != nil {
		h.cfg.Logger.Error("Cannot render a console page", err, map[string]any{"page": page})
		http.Error(w, "render "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = buf.WriteTo(w)
}

// refuse answers with a page that says, in one sentence, what happened and what to do.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<!doctype html><html lang="en"><meta charset="utf-8"><title>outboxkit console</title><link rel="stylesheet" href="%s/static/%s"><main><div class="flash bad" id="refused" role="alert">%s</div><a class="btn" href="%s/">Back to the console</a></main></html>`,
		h.cfg.Prefix, h.css, template.HTMLEscapeString(msg), h.cfg.Prefix)
}

func (h *Handler) serveStatic(w http.ResponseWriter, r *http.Request) {
	f, ok := h.files[r.PathValue("name")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", f.ct)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable") // the name carries the hash
	_, _ = w.Write(f.body)
}

func (h *Handler) rates() []int {
	var out []int
	for _, r := range []int{10, 50, 100, 200, 500, 1000, 2000, 5000} {
		if r <= h.cfg.MaxRate {
			out = append(out, r)
		}
	}
	return out
}

// --- template functions ----------------------------------------------------------------------

var placeholder = regexp.MustCompile(`‹[^›]*›`)

var jsonToken = regexp.MustCompile(`("(?:[^"\\]|\\.)*")(\s*:)?|\b(-?\d+(?:\.\d+)?|true|false|null)\b`)

var funcs = template.FuncMap{
	"pe":          url.PathEscape,
	"since":       func(t time.Time) time.Duration { return time.Since(t) },
	"commas":      func(v any) string { return commas(toInt64(v)) },
	"int64":       func(v any) int64 { return toInt64(v) },
	"human":       human,
	"ago":         func(t time.Time) string { return ago(time.Since(t)) },
	"agoD":        ago,
	"utc":         func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"utcShort":    func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	"utcShortDay": func(t time.Time) string { return t.UTC().Format("Mon 2 Jan 15:04 UTC") },
	"rate": func(f float64) string {
		if f >= 100 {
			return commas(int64(f + .5))
		}
		return strconv.FormatFloat(f, 'f', 1, 64)
	},
	"pct": func(f float64) string { return strconv.FormatFloat(max(2, f*100), 'f', 1, 64) },
	"pctOf": func(a, b int64) int64 {
		if b == 0 {
			return 0
		}
		return a * 100 / b
	},
	"sub": func(a, b int64) int64 { return a - b },
	"sev": func(s severity) string {
		return map[severity]string{sevOK: "ok", sevWarn: "warn", sevBad: "bad"}[s]
	},
	"envClass": func(env string) string {
		switch strings.ToLower(env) {
		case "production", "prod":
			return "prod"
		}
		return "staging"
	},
	"join":   strings.Join,
	"plural": func(n any, one, many string) string { return plural(int(min(toInt64(n), 2)), one, many) },
	"title": func(s string) string {
		if s == "" {
			return s
		}
		return strings.ToUpper(s[:1]) + s[1:]
	},
	"jobClass": func(s string) string {
		return map[string]string{"running": "warn", "preparing": "warn", "queued": "idle", "done": "ok", "cancelled": "idle", "failed": "bad", "cancelling": "warn"}[s]
	},
	"jobSym": func(s string) string {
		return map[string]string{"running": "▶", "preparing": "…", "queued": "…", "done": "✔", "cancelled": "■", "failed": "✖", "cancelling": "■"}[s]
	},
	// pattern shows a normalised error with its placeholders marked.
	"pattern": func(s string) template.HTML {
		esc := template.HTMLEscapeString(s)
		return template.HTML(placeholder.ReplaceAllStringFunc(esc, func(m string) string { return `<span class="ph">` + m + `</span>` }))
	},
	// json colours pretty-printed JSON (escaped first: payloads are untrusted).
	"json": func(s string) template.HTML {
		esc := template.HTMLEscapeString(s)
		// HTMLEscapeString turns " into &#34;: colour on the escaped text.
		esc = strings.ReplaceAll(esc, "&#34;", `"`)
		out := jsonToken.ReplaceAllStringFunc(esc, func(m string) string {
			sm := jsonToken.FindStringSubmatch(m)
			switch {
			case sm[1] != "" && sm[2] != "":
				return `<span class="jk">` + sm[1] + `</span>` + sm[2]
			case sm[1] != "":
				return `<span class="js">` + sm[1] + `</span>`
			}
			return `<span class="jn">` + m + `</span>`
		})
		return template.HTML(out)
	},
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case float64:
		return int64(x)
	}
	return 0
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// human says a duration the way a person says it: "3 h 12 m", "48 s", "120 ms".
func human(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d m %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d m", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%d d %d h", int(d.Hours())/24, int(d.Hours())%24)
}

// agoText is "just now" or "3 m 4 s ago".
func agoText(d time.Duration) string { return ago(d) }

// ago is "just now" or "3 m 4 s ago".
func ago(d time.Duration) string {
	if d < 5*time.Second {
		return "just now"
	}
	return human(d) + " ago"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
