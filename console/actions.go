package console

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// MaxSelected is the most letters one "replay selected" or "archive selected" takes; more go
// through a filter's preview and a job.
const MaxSelected = 100

// jobSides are the sides a selection's jobs run on: a job runs on the outbox or on consumers.
func jobSides(side string) []string {
	switch side {
	case "":
		return []string{store.SideOutbox, store.SideConsumers}
	case store.SideOutbox:
		return []string{store.SideOutbox}
	}
	return []string{side}
}

func (h *Handler) previewPage(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	f := parseFilter(r.URL.Query())
	kind := store.JobReplay
	if r.URL.Query().Get("kind") == "archive" {
		kind = store.JobArchive
	}
	q, err := h.query(f)
	if err != nil {
		h.refuse(w, r, http.StatusBadRequest, "The filter is not usable: "+err.Error()+".")
		return
	}
	if f.Archived {
		h.refuse(w, r, http.StatusBadRequest, "Archived letters are never replayed or archived again.")
		return
	}
	if kind == store.JobReplay && h.cfg.Publisher == nil && q.Side != store.SideOutbox {
		h.refuse(w, r, http.StatusConflict, "This console has no publisher, so consumers' dead letters cannot be replayed from it "+
			"(the outbox's can: the relay publishes them). Run it with a broker (outboxctl console --broker URL), or archive them.")
		return
	}
	n, _, err := h.con.CountDeadLetters(ctx, q, -1)
	if err != nil {
		h.failed(w, r, "count the selection", err)
		return
	}
	if n == 0 {
		h.refuse(w, r, http.StatusOK, fmt.Sprintf("Nothing matches this filter any more: no dead letter would be %s.", map[string]string{
			store.JobReplay: "replayed", store.JobArchive: "archived"}[kind]))
		return
	}
	pv := preview{Filter: f, Chips: h.chips(ctx, f, false), Count: n, Rate: h.cfg.DefaultRate, Nonce: randomID(), Query: filterQuery(f).Encode()}
	groups, err := h.con.GroupCounts(ctx, q, 0)
	if err != nil {
		h.failed(w, r, "break the selection down", err)
		return
	}
	byKey := map[[2]string]int64{}
	for _, g := range groups {
		byKey[[2]string{g.Side, h.cache.group(ctx, g.Side, g.FailureGroup).EventType}] += g.Count
	}
	for k, c := range byKey {
		pv.Breakdown = append(pv.Breakdown, [3]string{k[0], k[1], commas(c)})
	}
	sort.Slice(pv.Breakdown, func(i, j int) bool {
		return pv.Breakdown[i][0]+pv.Breakdown[i][1] < pv.Breakdown[j][0]+pv.Breakdown[j][1]
	})
	q.Limit, q.ScanLimit = 5, h.cfg.ScanLimit
	if sample, err := h.con.ListDeadLetters(ctx, q); err == nil {
		for _, l := range sample.Letters {
			pv.Sample = append(pv.Sample, h.letterRow(l))
		}
	}
	pv.Duration = time.Duration(float64(n)/float64(pv.Rate)*float64(time.Second)) + time.Second
	title := "Confirm replay"
	if kind == store.JobArchive {
		title = "Confirm archive"
	}
	h.render(w, r, "preview", title, "letters", id, pv, nil)
}

func (h *Handler) createJob(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	fq, _ := url.ParseQuery(r.PostFormValue("filter"))
	f := parseFilter(fq)
	q, err := h.query(f)
	if err != nil {
		h.refuse(w, r, http.StatusBadRequest, "The filter is not usable: "+err.Error()+".")
		return
	}
	kind := store.JobReplay
	if r.PostFormValue("kind") == "archive" {
		kind = store.JobArchive
	}
	rate, _ := strconv.Atoi(r.PostFormValue("rate"))
	if rate <= 0 {
		rate = h.cfg.DefaultRate
	}
	rate = min(rate, h.cfg.MaxRate)
	expect, _ := strconv.ParseInt(r.PostFormValue("expect"), 10, 64)
	nonce := r.PostFormValue("nonce")
	if nonce == "" || f.Archived {
		h.refuse(w, r, http.StatusBadRequest, "This form is incomplete: open the preview again.")
		return
	}
	if kind == store.JobReplay && h.cfg.Publisher == nil && q.Side != store.SideOutbox {
		h.refuse(w, r, http.StatusConflict, "This console has no publisher: consumers' dead letters cannot be replayed from it.")
		return
	}
	var jobs []store.Job
	for _, side := range jobSides(q.Side) {
		jq := q
		if q.Side == "" {
			jq.Side = side
		}
		j, created, err := h.con.CreateJob(ctx, store.NewJob{Kind: kind, Filter: jq, RequestKey: nonce + "/" + side, Rate: rate, Expected: expect,
			By: id.Name, Now: h.cfg.Now()})
		if err != nil {
			h.audit(r, id, store.AuditEntry{Action: kind, Filter: filterQuery(f).Encode(), Matched: expect}, "failed: "+err.Error(), false)
			h.failed(w, r, "create the job", err)
			return
		}
		if j.Total == 0 {
			continue // nothing of this side in the selection
		}
		jobs = append(jobs, j)
		if created {
			h.audit(r, id, store.AuditEntry{Action: kind, Filter: filterQuery(f).Encode(), Matched: expect, JobID: j.ID},
				fmt.Sprintf("job #%d started: %s %s at %d a second", j.ID, commas(j.Total), plural(int(min(j.Total, 2)), "letter", "letters"), rate), true)
		}
	}
	h.wakeRunner()
	switch len(jobs) {
	case 0:
		h.refuse(w, r, http.StatusOK, "Nothing matches this filter any more: no job was started.")
	case 1:
		http.Redirect(w, r, fmt.Sprintf("%s/jobs/%d", h.cfg.Prefix, jobs[0].ID), http.StatusSeeOther)
	default:
		http.Redirect(w, r, h.cfg.Prefix+"/jobs", http.StatusSeeOther)
	}
}

// act replays or archives the letters selected on a page: a job per side, run in the request.
func (h *Handler) act(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	refs := r.PostForm["id"]
	kind := r.PostFormValue("action")
	back := h.backTo(r)
	if kind != store.JobReplay && kind != store.JobArchive {
		h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%q: the selected letters are replayed or archived.", kind))
		return
	}
	if len(refs) == 0 {
		redirectFlash(w, r, back, "Nothing was selected: tick the letters first.", false)
		return
	}
	if len(refs) > MaxSelected {
		h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("At most %d letters at once from a page; use “Replay all matching…” for more.", MaxSelected))
		return
	}
	bySide := map[string][]int64{}
	for _, ref := range refs {
		side, num, ok := strings.Cut(ref, ":")
		n, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || side == "" {
			h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a letter of this console.", ref))
			return
		}
		bySide[side] = append(bySide[side], n)
	}
	if kind == store.JobReplay && h.cfg.Publisher == nil {
		for side := range bySide {
			if side != store.SideOutbox {
				h.refuse(w, r, http.StatusConflict, "This console has no publisher: consumers' dead letters cannot be replayed from it.")
				return
			}
		}
	}
	var applied, skipped, failed int64
	var jobIDs []string
	for side, ids := range bySide {
		j, _, err := h.con.CreateJob(ctx, store.NewJob{Kind: kind, Filter: store.LetterQuery{Side: side, IDs: ids}, RequestKey: "selected/" + randomID(),
			Rate: h.cfg.MaxRate, Expected: int64(len(ids)), By: id.Name, Now: h.cfg.Now()})
		if err == nil {
			j, err = h.runInline(ctx, j)
		}
		if err != nil {
			h.audit(r, id, store.AuditEntry{Action: kind + " selected", Filter: url.Values{"side": {side}}.Encode(), Matched: int64(len(ids))},
				"failed: "+err.Error(), false)
			h.failed(w, r, kind+" the selected letters", err)
			return
		}
		applied += j.Applied
		failed += j.Failed
		skipped += int64(len(ids)) - j.Applied - j.Failed
		jobIDs = append(jobIDs, "#"+strconv.FormatInt(j.ID, 10))
		if j.State == store.JobFailed {
			failed += max(0, j.Total-j.Applied-j.Failed)
		}
	}
	verb := map[string]string{store.JobReplay: "Replayed", store.JobArchive: "Archived"}[kind]
	msg := fmt.Sprintf("%s %d %s", verb, applied, plural(int(min(applied, 2)), "letter", "letters"))
	if skipped > 0 {
		msg += fmt.Sprintf(" · %d %s already replayed or archived: nothing to do", skipped, plural(int(min(skipped, 2)), "was", "were"))
	}
	if failed > 0 {
		msg += fmt.Sprintf(" · %d could not be sent: see the job", failed)
	}
	h.audit(r, id, store.AuditEntry{Action: kind + " selected", Matched: int64(len(refs)), Affected: applied}, msg+" (job "+strings.Join(jobIDs, ", ")+")", true)
	h.cache.invalidate()
	redirectFlash(w, r, back, msg, failed == 0)
}

// backTo is the console page a form was posted from, or the list.
func (h *Handler) backTo(r *http.Request) string {
	if u, err := url.Parse(r.Referer()); err == nil && strings.HasPrefix(u.Path, h.cfg.Prefix+"/") {
		q := u.Query()
		q.Del("flash")
		q.Del("ok")
		u.RawQuery = q.Encode()
		return u.RequestURI()
	}
	return h.cfg.Prefix + "/letters"
}

func redirectFlash(w http.ResponseWriter, r *http.Request, to, msg string, ok bool) {
	u, _ := url.Parse(to)
	q := u.Query()
	q.Set("flash", msg)
	if ok {
		q.Set("ok", "1")
	}
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
}
