package console

import (
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

func (h *Handler) letterPage(w http.ResponseWriter, r *http.Request, who Identity) {
	ctx := r.Context()
	side := r.PathValue("side")
	id, ok := h.pathID(w, r, "a dead letter's")
	if !ok {
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
	id, ok := h.pathID(w, r, "a dead letter's")
	if !ok {
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
