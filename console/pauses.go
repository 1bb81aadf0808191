package console

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/outboxkit/outboxkit/store"
)

func (h *Handler) pauseAction(scope string) page {
	return func(w http.ResponseWriter, r *http.Request, id Identity) {
		name, verb := r.PathValue("name"), r.PathValue("verb")
		e := store.AuditEntry{Action: verb + " " + scope + " " + name}
		var (
			changed bool
			err     error
			text    string
		)
		switch verb {
		case "pause":
			changed, err = h.con.SetPause(r.Context(), store.Pause{Scope: scope, Name: name, By: id.Name, Reason: r.PostFormValue("reason"), At: h.cfg.Now()})
			text = fmt.Sprintf("%s %s paused: relays stop publishing it from their next row, within their current pass.", title(scope), name)
			if scope == store.PauseRelay {
				text = fmt.Sprintf("Relay %s paused: it publishes nothing from its next row.", name)
			}
			if !changed {
				text = fmt.Sprintf("%s %s was paused already: nothing changed.", title(scope), name)
			}
		case "resume":
			changed, err = h.con.ClearPause(r.Context(), scope, name)
			text = fmt.Sprintf("%s %s resumed: its rows go out in order.", title(scope), name)
			if !changed {
				text = fmt.Sprintf("%s %s was not paused: nothing changed.", title(scope), name)
			}
		default:
			h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%q: a %s is paused or resumed.", verb, scope))
			return
		}
		if err != nil {
			h.audit(r, id, e, "failed: "+err.Error(), false)
			h.failed(w, r, verb+" "+scope+" "+name, err)
			return
		}
		if changed {
			e.Affected = 1
		}
		h.audit(r, id, e, text, true)
		h.cache.invalidate()
		http.Redirect(w, r, h.cfg.Prefix+"/?ok=1&flash="+url.QueryEscape(text), http.StatusSeeOther)
	}
}
