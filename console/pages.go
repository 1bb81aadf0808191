package console

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

func (h *Handler) routes() {
	p := h.cfg.Prefix
	m := h.mux
	m.HandleFunc("GET "+p+"/static/{name}", h.serveStatic)
	m.HandleFunc("GET "+p+"/healthz", h.healthz)
	m.HandleFunc("GET "+p+"/robots.txt", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("User-agent: *\nDisallow: /\n"))
	})
	m.HandleFunc("GET "+p+"/login", h.loginPage)
	m.HandleFunc("POST "+p+"/login", h.login)
	m.HandleFunc("POST "+p+"/logout", h.logout)
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

type notice struct{ Title, Text string }

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

// ---- overview -------------------------------------------------------------------------------

func (h *Handler) overviewPage(w http.ResponseWriter, r *http.Request, id Identity) {
	s, err := h.cache.read(r.Context())
	if err != nil {
		h.failed(w, r, "read the overview", err)
		return
	}
	h.render(w, r, "overview", "Overview", "overview", id, h.buildOverview(r.Context(), s), nil)
}

// groupRows names and sizes failure groups for a table: at most limit, largest first.
func (h *Handler) groupRows(ctx context.Context, groups []store.GroupCount, limit int) []groupRow {
	now := h.cfg.Now()
	var out []groupRow
	var largest int64
	for _, g := range groups {
		largest = max(largest, g.Count)
	}
	for i, g := range groups {
		if limit > 0 && i >= limit {
			break
		}
		gi := h.cache.group(ctx, g.Side, g.FailureGroup)
		row := groupRow{ID: strconv.FormatInt(g.FailureGroup, 10), Side: sideOf(g.Side), EventType: gi.EventType, Pattern: gi.Pattern,
			Example: gi.Example, Count: g.Count, FirstSeen: now.Sub(g.First), LastSeen: now.Sub(g.Last)}
		if largest > 0 {
			row.Share = float64(g.Count) / float64(largest)
		}
		out = append(out, row)
	}
	return out
}

// ---- filters --------------------------------------------------------------------------------

var withins = [][2]string{{"", "any time"}, {"15m", "last 15 minutes"}, {"1h", "last hour"}, {"6h", "last 6 hours"}, {"24h", "last 24 hours"}, {"7d", "last 7 days"}}

var withinDur = map[string]time.Duration{"15m": 15 * time.Minute, "1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

func parseFilter(q url.Values) filter {
	return filter{Side: q.Get("side"), Topic: q.Get("topic"), EventType: q.Get("type"), PartitionKey: q.Get("key"),
		ErrorText: q.Get("q"), Group: q.Get("group"), Within: q.Get("within"), From: q.Get("from"), Until: q.Get("until"),
		Archived: q.Get("archived") == "1"}
}

func filterQuery(f filter) url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("side", f.Side)
	set("topic", f.Topic)
	set("type", f.EventType)
	set("key", f.PartitionKey)
	set("q", f.ErrorText)
	set("group", f.Group)
	set("within", f.Within)
	set("from", f.From)
	set("until", f.Until)
	if f.Archived {
		q.Set("archived", "1")
	}
	return q
}

// utcLayouts are how a person may type a time in the filter: UTC, minutes or seconds.
var utcLayouts = []string{"2006-01-02 15:04", "2006-01-02 15:04:05", "2006-01-02T15:04", "2006-01-02T15:04:05Z", time.RFC3339, "2006-01-02"}

func parseUTC(s string) (time.Time, error) {
	for _, l := range utcLayouts {
		if t, err := time.ParseInLocation(l, strings.TrimSpace(s), time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time: use 2026-12-01 02:30 (UTC)", s)
}

// query turns a filter into a store selection; a field that does not parse is an error that
// names it.
func (h *Handler) query(f filter) (store.LetterQuery, error) {
	q := store.LetterQuery{Side: f.Side, Topic: f.Topic, EventType: f.EventType, PartitionKey: f.PartitionKey,
		ErrorContains: f.ErrorText, Archived: f.Archived}
	if f.Group != "" {
		g, err := strconv.ParseInt(f.Group, 10, 64)
		if err != nil {
			return q, fmt.Errorf("failure group %q is not a group's id", f.Group)
		}
		q.FailureGroup, q.ByGroup = g, true
	}
	if f.Within != "" {
		d, ok := withinDur[f.Within]
		if !ok {
			return q, fmt.Errorf("dead-lettered within %q: choose 15m, 1h, 6h, 24h or 7d", f.Within)
		}
		q.From = h.cfg.Now().Add(-d)
	}
	var err error
	if f.From != "" {
		if q.From, err = parseUTC(f.From); err != nil {
			return q, fmt.Errorf("from: %w", err)
		}
	}
	if f.Until != "" {
		if q.Until, err = parseUTC(f.Until); err != nil {
			return q, fmt.Errorf("until: %w", err)
		}
	}
	return q, nil
}

func (h *Handler) chips(ctx context.Context, f filter, removable bool) []chip {
	var out []chip
	add := func(label, value, key string) {
		if value == "" {
			return
		}
		c := chip{Label: label, Value: value}
		if removable {
			q := filterQuery(f)
			q.Del(key)
			c.Remove = h.cfg.Prefix + "/letters?" + q.Encode()
		}
		out = append(out, c)
	}
	add("where", f.Side, "side")
	if f.Group != "" {
		g, _ := strconv.ParseInt(f.Group, 10, 64)
		add("failure group", h.cache.group(ctx, f.Side, g).Pattern, "group")
	}
	add("topic", f.Topic, "topic")
	add("event type", f.EventType, "type")
	add("key", f.PartitionKey, "key")
	add("error contains", f.ErrorText, "q")
	add("dead-lettered", map[string]string{"15m": "in the last 15 minutes", "1h": "in the last hour", "6h": "in the last 6 hours",
		"24h": "in the last 24 hours", "7d": "in the last 7 days"}[f.Within], "within")
	add("from", f.From, "from")
	add("until", f.Until, "until")
	if f.Archived {
		add("showing", "archived letters", "archived")
	}
	return out
}

// cursor tokens: microseconds, o or c (outbox or consumers), id.
func cursorToken(c store.LetterCursor) string {
	side := "c"
	if c.Outbox {
		side = "o"
	}
	return fmt.Sprintf("%d.%s.%d", c.At.UnixMicro(), side, c.ID)
}

func parseCursor(s string) (store.LetterCursor, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return store.LetterCursor{}, false
	}
	us, err1 := strconv.ParseInt(parts[0], 10, 64)
	id, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || (parts[1] != "o" && parts[1] != "c") {
		return store.LetterCursor{}, false
	}
	return store.LetterCursor{At: time.UnixMicro(us).UTC(), Outbox: parts[1] == "o", ID: id}, true
}

func (h *Handler) letterRow(l store.DeadLetter) letterRow {
	return letterRow{Ref: fmt.Sprintf("%s:%d", l.Side(), l.ID), ID: l.ID, Side: sideOf(l.Side()), MessageID: l.MessageID, Topic: l.Topic,
		EventType: l.EventType, PartitionKey: l.PartitionKey, Error: firstLine(l.Reason), Attempts: l.Attempts,
		DeadFor: h.cfg.Now().Sub(l.DeadLetteredAt), At: l.DeadLetteredAt, PayloadSize: l.PayloadSize, Replayed: !l.ReplayedAt.IsZero(),
		Archived: !l.ArchivedAt.IsZero(), ReplayedAt: l.ReplayedAt, ArchivedAt: l.ArchivedAt}
}

// ---- dead letters ---------------------------------------------------------------------------

func (h *Handler) lettersPage(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	f := parseFilter(r.URL.Query())
	q, ferr := h.query(f)
	var fl *flash
	if ferr != nil {
		fl = &flash{Text: "The filter is not usable: " + ferr.Error() + "."}
		f, q = filter{Side: f.Side}, store.LetterQuery{Side: f.Side}
	}
	snap, err := h.cache.read(ctx)
	if err != nil {
		h.failed(w, r, "read the dead letters", err)
		return
	}
	lp := lettersPage{Filter: f, Chips: h.chips(ctx, f, true), Query: filterQuery(f).Encode(), Withins: withins}
	// Tabs: everywhere, the outbox, each consumer, with what waits there.
	counts := map[string]int64{}
	var all int64
	topicSet, typeSet := map[string]bool{}, map[string]bool{}
	for _, t := range snap.totals {
		counts[t.Side] += t.Count
		all += t.Count
		if t.Topic != "" {
			topicSet[t.Topic] = true
		}
	}
	for _, b := range snap.backlog {
		topicSet[b.Topic] = true
	}
	sides := []string{"", store.SideOutbox}
	for name := range counts {
		if name != store.SideOutbox {
			sides = append(sides, name)
		}
	}
	for name := range h.cfg.Consumers {
		if _, ok := counts[name]; !ok {
			sides = append(sides, name)
		}
	}
	sort.Strings(sides[2:])
	for _, s := range sides {
		label, n := s, counts[s]
		if s == "" {
			label, n = "Everywhere", all
		}
		lp.Sides = append(lp.Sides, sideTab{Label: label, URL: h.cfg.Prefix + "/letters?" + filterQuery(filter{Side: s}).Encode(), Count: n, Active: f.Side == s})
	}
	groups, note, err := h.cache.groupCounts(ctx, q)
	if err != nil {
		h.failed(w, r, "count the failure groups", err)
		return
	}
	lp.GroupsNote = note
	if !q.ByGroup {
		rows := h.groupRows(ctx, groups, 0)
		for _, g := range rows {
			if g.EventType != "" {
				typeSet[g.EventType] = true
			}
		}
		if r.URL.Query().Get("groups") != "all" && len(rows) > 10 {
			lp.MoreGroups = len(rows) - 10
			rows = rows[:10]
		}
		lp.Groups = rows
	} else {
		lp.Groups = h.groupRows(ctx, groups, 0)
	}
	for _, g := range snap.groups { // every event type that has a waiting letter
		if et := h.cache.group(ctx, g.Side, g.FailureGroup).EventType; et != "" {
			typeSet[et] = true
		}
	}
	for t := range topicSet {
		lp.Topics = append(lp.Topics, t)
	}
	for t := range typeSet {
		lp.EventTypes = append(lp.EventTypes, t)
	}
	if f.EventType != "" && !typeSet[f.EventType] {
		lp.EventTypes = append(lp.EventTypes, f.EventType)
	}
	sort.Strings(lp.Topics)
	sort.Strings(lp.EventTypes)

	q.Limit, q.ScanLimit = h.cfg.PageSize, h.cfg.ScanLimit
	before := r.URL.Query().Get("before")
	if before != "" {
		c, ok := parseCursor(before)
		if !ok {
			fl = &flash{Text: "The page's position is not usable: showing the newest letters."}
		}
		q.Before = c
	}
	page, err := h.con.ListDeadLetters(ctx, q)
	if err != nil {
		h.failed(w, r, "list the dead letters", err)
		return
	}
	for _, l := range page.Letters {
		lp.Letters = append(lp.Letters, h.letterRow(l))
	}
	switch {
	case q.Unindexed() && before == "" && page.Next.IsZero() && !page.ScanStopped:
		lp.Total = int64(len(page.Letters)) // the whole selection is on this page
	case q.Unindexed():
		lp.Total = -1 // a count would read every letter of the selection: the preview counts
	case sideOnly(q):
		// What waits on a side is among the cached figures (exact, counted seconds ago): the
		// commonest page counts nothing.
		for _, t := range snap.totals {
			if f.Side == "" || t.Side == f.Side || (f.Side == store.SideConsumers && t.Side != store.SideOutbox) {
				lp.Total += t.Count
			}
		}
	default:
		lp.Total, lp.TotalCap, err = h.con.CountDeadLetters(ctx, q, h.cfg.CountCap)
		if err != nil {
			h.failed(w, r, "count the dead letters", err)
			return
		}
	}
	if page.ScanStopped {
		lp.Searched = page.Scanned
	}
	if !page.Next.IsZero() {
		nq := filterQuery(f)
		nq.Set("before", cursorToken(page.Next))
		lp.OlderURL = h.cfg.Prefix + "/letters?" + nq.Encode()
	}
	if before != "" {
		lp.NewerURL = h.cfg.Prefix + "/letters?" + filterQuery(f).Encode()
	}
	title := "Dead letters"
	if f.Archived {
		title = "Archived dead letters"
	}
	h.render(w, r, "letters", title, "letters", id, lp, fl)
}

func (h *Handler) letterPage(w http.ResponseWriter, r *http.Request, who Identity) {
	ctx := r.Context()
	side := r.PathValue("side")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%q is not a dead letter's number.", r.PathValue("id")))
		return
	}
	l, err := h.con.DeadLetter(ctx, side, id, PayloadShown)
	if errors.Is(err, store.ErrNoLetter) {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter #%d waits on %s: it was never dead-lettered there, or it was replayed and has been published.", id, side))
		return
	}
	if err != nil {
		h.failed(w, r, "read the dead letter", err)
		return
	}
	d := letterDetail{Letter: h.letterRow(l), FullError: l.Reason, Pattern: store.NormalizeError(l.Reason),
		GroupID: strconv.FormatInt(l.FailureGroup, 10), CreatedAt: l.CreatedAt}
	// The group's size from the cached failure groups: counting it here would read every dead
	// letter of the side where no index serves the group (the outbox on MySQL).
	if groups, _, err := h.cache.groupCounts(ctx, store.LetterQuery{Side: side}); err == nil {
		for _, g := range groups {
			if g.Side == side && g.FailureGroup == l.FailureGroup {
				d.GroupCount = g.Count
			}
		}
	}
	if l.Consumer != "" {
		d.OutboundKey = outboxkit.OutboundKey(l.Consumer, l.MessageID)
	}
	if tp := l.Metadata["traceparent"]; tp != "" {
		if parts := strings.Split(tp, "-"); len(parts) == 4 && len(parts[1]) == 32 {
			d.TraceID = parts[1]
			if h.cfg.TraceURL != "" {
				d.TraceURL = strings.ReplaceAll(h.cfg.TraceURL, "{trace_id}", url.QueryEscape(d.TraceID))
			}
		}
	}
	redacted := map[string]bool{}
	for _, k := range h.cfg.RedactMetadata {
		redacted[k] = true
	}
	for k, v := range l.Metadata {
		if redacted[k] {
			v = "redacted"
		}
		d.Metadata = append(d.Metadata, [2]string{k, v})
	}
	sort.Slice(d.Metadata, func(i, j int) bool { return d.Metadata[i][0] < d.Metadata[j][0] })
	switch written, err := time.Parse(time.RFC3339Nano, l.Metadata[outboxkit.MetadataCreatedAt]); {
	case !l.CreatedAt.IsZero():
		d.History = append(d.History, historyRow{At: l.CreatedAt, What: fmt.Sprintf("written to the outbox (seq %d)", l.ID), Who: "writer"})
	case err == nil: // a consumer's letter that came through a relay: when its outbox row was written
		d.CreatedAt = written
		d.History = append(d.History, historyRow{At: written, What: fmt.Sprintf("written to the outbox (seq %s)", l.Metadata[outboxkit.MetadataSeq]), Who: "writer"})
	}
	what := fmt.Sprintf("dead-lettered by %s after %d %s", l.Side(), l.Attempts, plural(l.Attempts, "delivery", "deliveries"))
	if l.Consumer == "" {
		what = fmt.Sprintf("dead-lettered by the relay after %d %s", l.Attempts, plural(l.Attempts, "failed publish", "failed publishes"))
	}
	d.History = append(d.History, historyRow{At: l.DeadLetteredAt, What: what, Who: l.Side()})
	if !l.ReplayedAt.IsZero() {
		d.History = append(d.History, historyRow{At: l.ReplayedAt, What: "replayed", Who: "console"})
	}
	if !l.ArchivedAt.IsZero() {
		d.History = append(d.History, historyRow{At: l.ArchivedAt, What: "archived: it is never replayed", Who: "console"})
	}
	switch {
	case h.cfg.HidePayloads:
		d.PayloadHidden = true
	case !utf8.Valid(l.Payload):
		d.PayloadHex = hexDump(l.Payload)
	case json.Valid(l.Payload):
		var pretty strings.Builder
		b, _ := json.MarshalIndent(json.RawMessage(l.Payload), "", "  ")
		pretty.Write(b)
		d.PayloadJSON = pretty.String()
	default:
		d.PayloadText = string(l.Payload)
	}
	d.Truncated = l.PayloadSize > len(l.Payload)
	if d.Truncated && d.PayloadJSON == "" && d.PayloadHex == "" && !utf8.Valid(l.Payload) {
		d.PayloadHex = hexDump(l.Payload)
	}
	h.render(w, r, "letter", fmt.Sprintf("Dead letter %s #%d", side, id), "letters", who, d, nil)
}

// hexDump shows bytes as an offset, 16 bytes in hex, and their printable characters.
func hexDump(b []byte) string {
	var out strings.Builder
	for off := 0; off < len(b); off += 16 {
		line := b[off:min(off+16, len(b))]
		fmt.Fprintf(&out, "%08x  %-48s |", off, spaced(hex.EncodeToString(line)))
		for _, c := range line {
			if c < 32 || c > 126 {
				c = '.'
			}
			out.WriteByte(c)
		}
		out.WriteString("|\n")
	}
	return out.String()
}

func spaced(h string) string {
	var b strings.Builder
	for i := 0; i < len(h); i += 2 {
		b.WriteString(h[i : i+2])
		b.WriteByte(' ')
	}
	return b.String()
}

func (h *Handler) payload(w http.ResponseWriter, r *http.Request, _ Identity) {
	if h.cfg.HidePayloads {
		h.refuse(w, r, http.StatusNotFound, "Payloads are hidden on this console: they may hold personal data.")
		return
	}
	side := r.PathValue("side")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%q is not a dead letter's number.", r.PathValue("id")))
		return
	}
	b, err := h.con.DeadLetterPayload(r.Context(), side, id)
	if errors.Is(err, store.ErrNoLetter) {
		h.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter #%d on %s.", id, side))
		return
	}
	if err != nil {
		h.failed(w, r, "read the payload", err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="dead-letter-%s-%d.bin"`, url.PathEscape(side), id))
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// ---- audit ----------------------------------------------------------------------------------

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

// ---- pauses ---------------------------------------------------------------------------------

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

func title(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// sideOnly reports whether q selects the waiting letters of a side and nothing narrower.
func sideOnly(q store.LetterQuery) bool {
	return !q.Unindexed() && !q.ByGroup && q.PartitionKey == "" && q.From.IsZero() && q.Until.IsZero() && len(q.IDs) == 0 && !q.Archived
}
