package console

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"path"
	"strings"
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
	for _, page := range []string{"overview", "letters", "letter", "preview", "job", "jobs", "audit", "login", "message", "fleet"} {
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
	// A is where the stylesheet and the script are served: P, or a fleet's console's prefix.
	A string
	// Fleet is set on every page of a fleet's console (NewFleet).
	Fleet  *fleetBar
	Who    *Identity
	CanAct bool
	Flash  *flash
	Rates  []int
	Live   int // seconds between refreshes of the live region; 0: none
	Data   any
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, page, title, nav string, id Identity, data any, fl *flash) {
	pd := pageData{P: h.cfg.Prefix, A: h.assetPrefix(), Title: title, Nav: nav, Env: h.cfg.Environment, CSS: h.css, JS: h.js,
		Store: h.storeLine(), Clock: h.cfg.Now().UTC().Format("Mon 2 Jan 15:04:05 UTC"), CSRF: h.csrfToken(w, r), Data: data, Flash: fl,
		CanAct: id.Role >= Operator, Rates: h.rates(), Live: map[string]int{"overview": 10, "job": 1, "jobs": 5, "fleet": 5}[page]}
	switch {
	case h.fleet != nil:
		pd.Fleet = h.fleet.bar(nil, nav)
	case h.tenant != nil:
		pd.Fleet = h.tenant.f.bar(&h.tenant.outbox, nav)
	}
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

// storeLine names the database the page is about, for the bar under the top one.
func (h *Handler) storeLine() string {
	if h.fleet != nil {
		info := h.fleet.cfg.Coordination.Info()
		return fmt.Sprintf("fleet %s · coordination database %s · %s", h.fleet.cfg.Fleet, info.Name, info.Schema)
	}
	info := h.db.Info()
	return fmt.Sprintf("%s · %s · schema version %d", info.Name, info.Schema, h.cache.schemaVersion())
}

// assetPrefix is where the stylesheet and the script are served: a tenant's console uses its
// fleet's, so that the browser keeps one copy for every tenant.
func (h *Handler) assetPrefix() string {
	if h.tenant != nil {
		return h.assetRoot
	}
	return h.cfg.Prefix
}

// refuse answers with a page that says, in one sentence, what happened and what to do.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<!doctype html><html lang="en"><meta charset="utf-8"><title>outboxkit console</title><link rel="stylesheet" href="%s/static/%s"><main><div class="flash bad" id="refused" role="alert">%s</div><a class="btn" href="%s/">Back to the console</a></main></html>`,
		h.assetPrefix(), h.css, template.HTMLEscapeString(msg), h.cfg.Prefix)
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
