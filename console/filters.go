package console

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

var withins = [][2]string{{"", "any time"}, {"15m", "last 15 minutes"}, {"1h", "last hour"}, {"6h", "last 6 hours"}, {"24h", "last 24 hours"}, {"7d", "last 7 days"}}

// withinText is how a chip says the choice of withins named key; "" for none.
func withinText(key string) string {
	for _, w := range withins {
		if key != "" && w[0] == key {
			return "in the " + w[1]
		}
	}
	return ""
}

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
	add("dead-lettered", withinText(f.Within), "within")
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

// filterOf is a job's selection as the list's filter shows it.
func filterOf(f store.LetterQuery) filter {
	ff := filter{Side: f.Side, Topic: f.Topic, EventType: f.EventType, PartitionKey: f.PartitionKey, ErrorText: f.ErrorContains}
	if f.ByGroup {
		ff.Group = strconv.FormatInt(f.FailureGroup, 10)
	}
	if !f.From.IsZero() {
		ff.From = f.From.UTC().Format("2006-01-02 15:04:05")
	}
	if !f.Until.IsZero() {
		ff.Until = f.Until.UTC().Format("2006-01-02 15:04:05")
	}
	return ff
}
