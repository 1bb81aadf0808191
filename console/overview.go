package console

import (
	"context"
	"net/http"
	"strconv"

	"github.com/outboxkit/outboxkit/store"
)

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
