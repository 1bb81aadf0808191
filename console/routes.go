package console

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// baseRoutes are the routes of every console, a database's or a fleet's: its assets, its health
// (healthz), robots.txt, and signing in and out.
func (h *Handler) baseRoutes(healthz http.HandlerFunc) {
	p := h.cfg.Prefix
	m := h.mux
	m.HandleFunc("GET "+p+"/static/{name}", h.serveStatic)
	m.HandleFunc("GET "+p+"/healthz", healthz)
	m.HandleFunc("GET "+p+"/robots.txt", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("User-agent: *\nDisallow: /\n"))
	})
	m.HandleFunc("GET "+p+"/login", h.loginPage)
	m.HandleFunc("POST "+p+"/login", h.login)
	m.HandleFunc("POST "+p+"/logout", h.logout)
}

func (h *Handler) routes() {
	p := h.cfg.Prefix
	m := h.mux
	h.baseRoutes(h.healthz)
	m.HandleFunc("GET "+p+"/{$}", h.auth(Viewer, h.migrated(h.overviewPage)))
	m.HandleFunc("GET "+p+"/letters", h.auth(Viewer, h.migrated(h.lettersPage)))
	m.HandleFunc("GET "+p+"/letters/{side}/{id}", h.auth(Viewer, h.migrated(h.letterPage)))
	m.HandleFunc("GET "+p+"/letters/{side}/{id}/payload", h.auth(Viewer, h.migrated(h.payload)))
	m.HandleFunc("POST "+p+"/letters/act", h.auth(Operator, h.migrated(h.act)))
	m.HandleFunc("GET "+p+"/replay/preview", h.auth(Operator, h.migrated(h.previewPage)))
	m.HandleFunc("POST "+p+"/jobs", h.auth(Operator, h.migrated(h.createJob)))
	m.HandleFunc("GET "+p+"/jobs", h.auth(Viewer, h.migrated(h.jobsPage)))
	m.HandleFunc("GET "+p+"/jobs/{id}", h.auth(Viewer, h.migrated(h.jobPage)))
	m.HandleFunc("POST "+p+"/jobs/{id}/cancel", h.auth(Operator, h.migrated(h.cancelJob)))
	m.HandleFunc("POST "+p+"/topics/{name}/{verb}", h.auth(Operator, h.migrated(h.pauseAction(store.PauseTopic))))
	m.HandleFunc("POST "+p+"/relays/{name}/{verb}", h.auth(Operator, h.migrated(h.pauseAction(store.PauseRelay))))
	m.HandleFunc("GET "+p+"/audit", h.auth(Viewer, h.migrated(h.auditPage)))
	if p != "" {
		m.Handle("GET "+p, http.RedirectHandler(p+"/", http.StatusMovedPermanently))
	}
}

// migrated serves a page only on tables at this build's version, and otherwise says which
// migration is needed.
func (h *Handler) migrated(next page) page {
	return func(w http.ResponseWriter, r *http.Request, id Identity) {
		if msg := h.cache.schemaProblem(r.Context()); msg != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			h.render(w, r, "message", "Schema", "", id, notice{Title: "The database's tables are not at this console's version", Text: msg}, nil)
			return
		}
		next(w, r, id)
	}
}

// notice is the message page: a title, a sentence, and where to go from there when Link is set.
type notice struct{ Title, Text, Link, LinkText string }

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if msg := h.cache.schemaProblem(r.Context()); msg != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("schema\n")) // no detail: the health check answers anyone
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

func (h *Handler) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.cfg.Logger.Error("Console: "+what, err, nil)
	msg := fmt.Sprintf("Cannot %s: %v", what, err)
	if outboxkit.IsUnreachable(err) {
		msg = fmt.Sprintf("Cannot %s: the database cannot be reached (%v). The page works again once it answers.", what, err)
	}
	h.refuse(w, r, http.StatusServiceUnavailable, msg)
}

// pathID reads the number in the path's {id}, whose names what it numbers ("a job's"); a path
// without one is refused as not found.
func (h *Handler) pathID(w http.ResponseWriter, r *http.Request, whose string) (int64, bool) {
	n, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%q is not %s number.", r.PathValue("id"), whose))
		return 0, false
	}
	return n, true
}
