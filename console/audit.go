package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/outboxkit/outboxkit/store"
)

func auditEntryFor(r *http.Request, prefix string) store.AuditEntry {
	action := strings.TrimPrefix(r.URL.Path, prefix)
	if a := r.PostFormValue("action"); a != "" {
		action += " (" + a + ")"
	}
	return store.AuditEntry{Action: action, Filter: r.PostFormValue("filter")}
}

// audit records an action; a failure to record it is logged, never hidden.
func (h *Handler) audit(r *http.Request, id Identity, e store.AuditEntry, result string, ok bool) {
	e.At, e.Actor, e.Role, e.Result, e.OK = h.cfg.Now(), id.Name, id.Role.String(), result, ok
	if h.con == nil { // a fleet's own pages: no database of a tenant to record it in
		h.cfg.Logger.Info("Console action", map[string]any{"actor": id.Name, "action": e.Action, "result": result})
		return
	}
	if err := h.con.Audit(r.Context(), e); err != nil {
		h.cfg.Logger.Error("Cannot record an action in the console's audit", err, map[string]any{"actor": id.Name, "action": e.Action})
	}
}

func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request, id Identity) {
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	entries, err := h.con.AuditLog(r.Context(), before, 50)
	if err != nil {
		h.failed(w, r, "read the audit", err)
		return
	}
	var rows []auditRow
	for _, e := range entries {
		row := auditRow{ID: e.ID, At: e.At, Who: e.Actor, Role: e.Role, Action: e.Action, Matched: e.Matched, Affected: e.Affected,
			JobID: e.JobID, Result: e.Result, OK: e.OK}
		if q, err := url.ParseQuery(e.Filter); err == nil && e.Filter != "" {
			row.Chips = h.chips(r.Context(), parseFilter(q), false)
		}
		rows = append(rows, row)
	}
	older := ""
	if len(entries) == 50 {
		older = fmt.Sprintf("%s/audit?before=%d", h.cfg.Prefix, entries[len(entries)-1].ID)
	}
	h.render(w, r, "audit", "Audit", "audit", id, auditPage{Rows: rows, OlderURL: older}, nil)
}

type auditPage struct {
	Rows     []auditRow
	OlderURL string
}
