package console

import (
	"fmt"
	"net/http"
	"sort"

	"github.com/outboxkit/outboxkit/store"
)

func (h *Handler) letterRow(l store.DeadLetter) letterRow {
	return letterRow{Ref: fmt.Sprintf("%s:%d", l.Side(), l.ID), ID: l.ID, Side: sideOf(l.Side()), MessageID: l.MessageID, Topic: l.Topic,
		EventType: l.EventType, PartitionKey: l.PartitionKey, Error: firstLine(l.Reason), Attempts: l.Attempts,
		DeadFor: h.cfg.Now().Sub(l.DeadLetteredAt), At: l.DeadLetteredAt, PayloadSize: l.PayloadSize, Replayed: !l.ReplayedAt.IsZero(),
		Archived: !l.ArchivedAt.IsZero(), ReplayedAt: l.ReplayedAt, ArchivedAt: l.ArchivedAt}
}

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

// sideOnly reports whether q selects the waiting letters of a side and nothing narrower.
func sideOnly(q store.LetterQuery) bool {
	return !q.Unindexed() && !q.ByGroup && q.PartitionKey == "" && q.From.IsZero() && q.Until.IsZero() && len(q.IDs) == 0 && !q.Archived
}
