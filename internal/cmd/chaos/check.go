package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

var consumers = []string{"shipping", "billing", "search"}

// invariant is one line of the checker's verdict.
type invariant struct {
	name       string
	checked    int
	violations int
	examples   []string
}

func (iv *invariant) fail(format string, args ...any) {
	iv.violations++
	if len(iv.examples) < 5 {
		iv.examples = append(iv.examples, fmt.Sprintf(format, args...))
	}
}

// verdict is what the checker found.
type verdict struct {
	invariants []*invariant
	orders     int
	poisoned   int
	cancelled  int
	latency    []time.Duration            // commit → effect, OrderPlaced, every consumer
	latencyOf  map[string][]time.Duration // the same, per consumer
	doubles    int
	misses     int
}

func (v *verdict) add(name string) *invariant {
	iv := &invariant{name: name}
	v.invariants = append(v.invariants, iv)
	return iv
}

func (v *verdict) violations() int {
	n := 0
	for _, iv := range v.invariants {
		n += iv.violations
	}
	return n
}

// tables reads the soak's tables in one database of either dialect.
type tables struct {
	db     *store.DB
	prefix string
}

func newTables(db *store.DB, schema string) tables {
	t := tables{db: db}
	switch db.Dialect {
	case "postgres":
		t.prefix = `"` + schema + `".`
	case "mysql":
		t.prefix = "`" + schema + "`."
	}
	return t
}

func (t tables) q(query string) string {
	return t.db.Rebind(strings.ReplaceAll(query, "{{t}}.", t.prefix))
}

// rows runs query and hands each row's values, as text, to fn; an error of fn's (a value it cannot
// read) ends the query and is returned, so that the checker never judges a value it misread.
func (t tables) rows(ctx context.Context, query string, fn func(cols []string) error) error {
	inQuery := func(err error) error { return fmt.Errorf("%s: %w", strings.Join(strings.Fields(query), " "), err) }
	rows, err := t.db.SQL.QueryContext(ctx, t.q(query))
	if err != nil {
		return inQuery(err)
	}
	defer rows.Close()
	names, err := rows.Columns()
	if err != nil {
		return inQuery(err)
	}
	n := len(names)
	vals, ptrs := make([]any, n), make([]any, n)
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return inQuery(err)
		}
		cols := make([]string, n)
		for i, v := range vals {
			cols[i] = text(v)
		}
		if err := fn(cols); err != nil {
			return inQuery(err)
		}
	}
	if err := rows.Err(); err != nil {
		return inQuery(err)
	}
	return nil
}

// integer reads a column holding an id or a count.
func integer[T int | int64](col, what string) (T, error) {
	var v T
	if _, err := fmt.Sscan(col, &v); err != nil {
		return 0, fmt.Errorf("%s %q is not an integer: %w", what, col, err)
	}
	return v, nil
}

func text(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	default:
		return fmt.Sprint(x)
	}
}

// parseTime reads the demo's timestamps as each dialect returns them.
func parseTime(s string) (time.Time, bool) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999", "2006-01-02T15:04:05.000000Z"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

type effect struct {
	id      int64
	at      string
	message string
}

// check reads the databases and holds them against what the clients were told.
//
// With the log relay (logRelay) an event leaves no row behind: in table mode the relay removes
// each row once published, in WAL mode there never was one. The outbox invariant is then that no
// row is left after the drain, and every event's arrival is what its effects show.
func check(ctx context.Context, biz, gateway tables, l *ledger, logRelay bool) (*verdict, error) {
	v := &verdict{latencyOf: map[string][]time.Duration{}}
	l.mu.Lock()
	defer l.mu.Unlock()

	// The orders, and which key each answer named.
	type order struct {
		customer, created string
	}
	orders := map[string]order{}
	if err := biz.rows(ctx, `SELECT id, customer, created_at FROM {{t}}.orders`, func(c []string) error {
		orders[c[0]] = order{c[1], c[2]}
		return nil
	}); err != nil {
		return nil, err
	}
	v.orders = len(orders)
	keys := v.add("every key answered 2xx has exactly one order; every answer for it named that order")
	named := map[string]string{} // order id → key
	poisonOrder := map[string]bool{}
	for key, ids := range l.placed {
		keys.checked++
		id := ids[0]
		for _, other := range ids[1:] {
			if other != id {
				keys.fail("key %s was answered with orders %s and %s", key, id, other)
			}
		}
		if _, ok := orders[id]; !ok {
			keys.fail("key %s was answered with order %s, which does not exist", key, id)
		}
		if k, dup := named[id]; dup {
			keys.fail("order %s was the answer to keys %s and %s", id, k, key)
		}
		named[id] = key
		if l.poisoned[key] {
			poisonOrder[id] = true
		}
	}
	for id := range orders {
		if _, ok := named[id]; !ok {
			keys.fail("order %s was created, but no answer named it (a second order for a retried key?)", id)
		}
	}
	answered := v.add("every operation got a definitive answer (no POST left unanswered, none refused)")
	answered.checked = len(l.placed) + len(l.cancelKey)
	for key := range l.unsettled {
		answered.fail("key %s never got a definitive answer", key)
	}
	for _, r := range l.refused {
		answered.fail("refused: %s", r)
	}
	v.poisoned, v.cancelled = len(poisonOrder), len(l.cancelled)

	// Effects: one per event per consumer.
	effects := map[[3]string][]effect{} // consumer, order, event
	orphans := v.add("no effect without its order")
	if err := biz.rows(ctx, `SELECT consumer, order_id, event, id, applied_at, message_id FROM {{t}}.effects`, func(c []string) error {
		id, err := integer[int64](c[3], "effect id")
		if err != nil {
			return err
		}
		k := [3]string{c[0], c[1], c[2]}
		effects[k] = append(effects[k], effect{id: id, at: c[4], message: c[5]})
		orphans.checked++
		if _, ok := orders[c[1]]; !ok {
			orphans.fail("%s applied %s of unknown order %s", c[0], c[2], c[1])
		}
		return nil
	}); err != nil {
		return nil, err
	}
	once := v.add("every event has exactly one effect per consumer (misses and doubles counted apart)")
	poisonFree := v.add("no effect of a poisoned event")
	for id, o := range orders {
		events := []string{"OrderPlaced"}
		if l.cancelled[id] {
			events = append(events, "OrderCancelled")
		}
		for _, c := range consumers {
			if poisonOrder[id] {
				poisonFree.checked++
				if n := len(effects[[3]string{c, id, "OrderPlaced"}]); n > 0 {
					poisonFree.fail("%s applied poisoned order %s %d times", c, id, n)
				}
				continue
			}
			for _, ev := range events {
				once.checked++
				got := effects[[3]string{c, id, ev}]
				switch {
				case len(got) == 0:
					v.misses++
					once.fail("%s never applied %s of order %s", c, ev, id)
				case len(got) > 1:
					v.doubles += len(got) - 1
					once.fail("%s applied %s of order %s %d times", c, ev, id, len(got))
				}
				if ev == "OrderPlaced" && len(got) > 0 {
					created, ok1 := parseTime(o.created)
					applied, ok2 := parseTime(got[0].at)
					if ok1 && ok2 {
						v.latency = append(v.latency, applied.Sub(created))
						v.latencyOf[c] = append(v.latencyOf[c], applied.Sub(created))
					}
				}
			}
		}
	}

	// Per-key order: OrderCancelled applied after OrderPlaced, by every consumer.
	ordered := v.add("per-key order: every consumer applied OrderCancelled after OrderPlaced")
	for id := range l.cancelled {
		for _, c := range consumers {
			placed, cancelled := effects[[3]string{c, id, "OrderPlaced"}], effects[[3]string{c, id, "OrderCancelled"}]
			if len(placed) == 0 || len(cancelled) == 0 {
				continue // a miss, counted above
			}
			ordered.checked++
			if cancelled[0].id < placed[0].id {
				ordered.fail("%s applied order %s's OrderCancelled before its OrderPlaced", c, id)
			}
		}
	}

	// The outbox: one row per event, nothing pending, nothing dead-lettered by the forwarder.
	rowsPerOrder := map[string]int{}
	uuidOrder := map[string]string{}
	outboxName := "one outbox row per event; none pending or dead-lettered after the drain"
	if logRelay {
		outboxName = "no outbox row left after the drain: the log relay removes each row it published"
	}
	outbox := v.add(outboxName)
	if err := biz.rows(ctx, `SELECT partition_key, uuid,
			CASE WHEN published_at IS NOT NULL THEN 'published' WHEN dead_lettered_at IS NOT NULL THEN 'dead' ELSE 'pending' END
		FROM {{t}}.outbox`, func(c []string) error {
		rowsPerOrder[c[0]]++
		uuidOrder[strings.ToLower(c[1])] = c[0]
		outbox.checked++
		if c[2] != "published" {
			outbox.fail("outbox row %s of order %s is %s", c[1], c[0], c[2])
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for id := range orders {
		want := 1
		if l.cancelled[id] {
			want = 2
		}
		switch {
		case logRelay:
			outbox.checked += want // each event: no row left of it
		case rowsPerOrder[id] != want:
			outbox.fail("order %s has %d outbox rows, want %d", id, rowsPerOrder[id], want)
		}
	}

	// Dead letters: exactly the poisoned events, once per consumer.
	dead := v.add("every dead letter is a poisoned event; every poisoned event is a dead letter of each consumer")
	deadBy := map[[2]string]int{}
	if err := biz.rows(ctx, `SELECT consumer, message_id, partition_key FROM {{t}}.dead_letters WHERE replayed_at IS NULL`, func(c []string) error {
		dead.checked++
		id, ok := uuidOrder[strings.ToLower(c[1])]
		if logRelay { // no outbox row names the event: its partition key names the order
			_, ok = orders[c[2]]
			id = c[2]
		}
		switch {
		case !ok:
			dead.fail("%s dead-lettered message %s, which is no event of the soak's", c[0], c[1])
		case !poisonOrder[id]:
			dead.fail("%s dead-lettered the event of order %s, which was not poisoned", c[0], id)
		}
		deadBy[[2]string{c[0], id}]++
		return nil
	}); err != nil {
		return nil, err
	}
	for id := range poisonOrder {
		for _, c := range consumers {
			if deadBy[[2]string{c, id}] != 1 {
				dead.fail("%s has %d dead letters for poisoned order %s, want 1", c, deadBy[[2]string{c, id}], id)
			}
		}
	}

	// The payment gateway: one charge per order Billing handled, none for a poisoned one.
	charges := map[string]int{}
	if err := gateway.rows(ctx, `SELECT order_id FROM {{t}}.gateway_charges`, func(c []string) error { charges[c[0]]++; return nil }); err != nil {
		return nil, err
	}
	charged := v.add("the payment gateway charged every order exactly once (none poisoned)")
	for id := range orders {
		charged.checked++
		want := 1
		if poisonOrder[id] {
			want = 0
		}
		if charges[id] != want {
			charged.fail("order %s was charged %d times, want %d", id, charges[id], want)
		}
	}
	sort.Slice(v.latency, func(i, j int) bool { return v.latency[i] < v.latency[j] })
	for _, l := range v.latencyOf {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	}
	return v, nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

// handled counts, per consumer, the distinct events it applied or dead-lettered: the drain is over
// when each has handled every event and nothing is pending.
func handled(ctx context.Context, biz tables) (map[string]int, int, error) {
	n := map[string]int{}
	if err := biz.rows(ctx, `SELECT consumer, count(*) FROM (SELECT DISTINCT consumer, order_id, event FROM {{t}}.effects) e GROUP BY consumer`,
		func(c []string) error { k, err := integer[int](c[1], "count"); n[c[0]] += k; return err }); err != nil {
		return nil, 0, err
	}
	if err := biz.rows(ctx, `SELECT consumer, count(*) FROM {{t}}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer`,
		func(c []string) error { k, err := integer[int](c[1], "count"); n[c[0]] += k; return err }); err != nil {
		return nil, 0, err
	}
	pending := 0
	if err := biz.rows(ctx, `SELECT count(*) FROM {{t}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL`,
		func(c []string) (err error) { pending, err = integer[int](c[0], "count"); return err }); err != nil {
		return nil, 0, err
	}
	return n, pending, nil
}
