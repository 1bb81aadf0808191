package console

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

func (h *Handler) jobView(r *http.Request, j store.Job) job {
	now := h.cfg.Now()
	v := job{ID: j.ID, Kind: j.Kind, State: j.State, Total: j.Total, Replayed: j.Applied, Skipped: j.Skipped, Failed: j.Failed, Rate: j.Rate,
		Started: j.StartedAt, By: j.CreatedBy, Owner: j.Owner, LeaseOK: j.LeaseUntil.After(now), LastError: j.LastError, Waiting: j.Waiting}
	v.Done = min(j.Total, j.Applied+j.Skipped+j.Failed)
	if v.Started.IsZero() {
		v.Started = j.CreatedAt
	}
	switch {
	case !j.FinishedAt.IsZero():
		v.Elapsed = j.FinishedAt.Sub(v.Started)
	default:
		v.Elapsed = now.Sub(v.Started)
	}
	if j.Rate > 0 {
		v.ETA = time.Duration(float64(j.Total-v.Done) / float64(j.Rate) * float64(time.Second))
	}
	if j.Open() && !v.LeaseOK {
		v.Owner = "no console yet"
		if j.Owner != "" {
			v.Owner = j.Owner + " (its lease ran out " + ago(now.Sub(j.LeaseUntil)) + ")"
		}
		v.Waiting = "waiting for a console to run it: a console with jobs enabled (or outboxctl console) takes it within seconds"
	}
	if j.CancelBy != "" {
		v.LastError = strings.TrimSpace(fmt.Sprintf("cancelled by %s %s. %s", j.CancelBy, ago(now.Sub(j.CancelAt)), v.LastError))
	}
	f := j.Filter
	v.Chips = h.chips(r.Context(), filterOf(f), false)
	if len(f.IDs) > 0 {
		v.Chips = append(v.Chips, chip{Label: "selected", Value: fmt.Sprintf("%d %s", len(f.IDs), plural(len(f.IDs), "letter", "letters"))})
	}
	return v
}

func (h *Handler) jobsPage(w http.ResponseWriter, r *http.Request, id Identity) {
	jobs, err := h.con.Jobs(r.Context(), 0, 100)
	if err != nil {
		h.failed(w, r, "list the jobs", err)
		return
	}
	var out []job
	for _, j := range jobs {
		out = append(out, h.jobView(r, j))
	}
	h.render(w, r, "jobs", "Jobs", "jobs", id, out, nil)
}

func (h *Handler) jobPage(w http.ResponseWriter, r *http.Request, id Identity) {
	n, ok := h.pathID(w, r, "a job's")
	if !ok {
		return
	}
	j, err := h.con.Job(r.Context(), n)
	if errors.Is(err, store.ErrNoJob) {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No job #%d.", n))
		return
	}
	if err != nil {
		h.failed(w, r, "read the job", err)
		return
	}
	h.render(w, r, "job", fmt.Sprintf("Job #%d", n), "jobs", id, h.jobView(r, j), nil)
}

func (h *Handler) cancelJob(w http.ResponseWriter, r *http.Request, id Identity) {
	n, ok := h.pathID(w, r, "a job's")
	if !ok {
		return
	}
	ok, err := h.con.RequestCancel(r.Context(), n, id.Name, h.cfg.Now())
	if err != nil {
		h.failed(w, r, "cancel the job", err)
		return
	}
	text := fmt.Sprintf("Job #%d is being cancelled: it stops before its next batch; what it did stays done.", n)
	if !ok {
		text = fmt.Sprintf("Job #%d had ended already: nothing to cancel.", n)
	}
	h.audit(r, id, store.AuditEntry{Action: "cancel job", JobID: n}, text, true)
	h.wakeRunner()
	redirectFlash(w, r, fmt.Sprintf("%s/jobs/%d", h.cfg.Prefix, n), text, ok)
}
