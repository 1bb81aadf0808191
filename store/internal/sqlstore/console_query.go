// How a console query becomes SQL: the conditions of a selection of letters, their ?N arguments,
// and the keyset of the newest-first order both sides' letters are listed in.

package sqlstore

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// farFuture is the cursor of the first page: newer than any letter.
var farFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// query is a statement being built: conditions and their ?N arguments.
type query struct {
	conds []string
	args  []any
}

func (q *query) arg(v any) int { q.args = append(q.args, v); return len(q.args) }

// cond adds a condition; each %d in it is replaced by the number of the next argument, in order.
func (q *query) cond(format string, args ...any) {
	nums := make([]any, len(args))
	for i, a := range args {
		nums[i] = q.arg(a)
	}
	q.conds = append(q.conds, fmt.Sprintf(format, nums...))
}

func (q *query) where() string { return strings.Join(q.conds, " AND ") }

// selection adds the conditions of lq on table t, except the keyset. indexedOnly leaves out the
// filters no index serves (the bound of a bounded scan is found on the others).
func (s *Store) selection(q *query, t letterTable, lq store.LetterQuery, indexedOnly bool) {
	c := s.d.Console()
	if lq.Archived {
		q.cond("archived_at IS NOT NULL")
		if t.outbox {
			q.cond("published_at IS NULL")
		}
	} else {
		q.conds = append(q.conds, t.waiting)
	}
	if consumer := lq.Consumer(); consumer != "" && !t.outbox {
		q.cond("consumer = ?%d", consumer)
	}
	if len(lq.IDs) > 0 {
		q.cond(t.id+" IN (?%d)", s.d.Int64s(lq.IDs))
	}
	if lq.ByGroup {
		if lq.FailureGroup == 0 {
			q.cond("failure_group IS NULL")
		} else {
			q.cond("failure_group = ?%d", lq.FailureGroup)
		}
	}
	if lq.PartitionKey != "" {
		q.cond("partition_key = ?%d", lq.PartitionKey)
	}
	if !lq.From.IsZero() {
		q.cond("dead_lettered_at >= ?%d", s.d.Time(lq.From))
	}
	if !lq.Until.IsZero() {
		q.cond("dead_lettered_at < ?%d", s.d.Time(lq.Until))
	}
	if indexedOnly {
		return
	}
	if lq.Topic != "" {
		q.cond("topic = ?%d", lq.Topic)
	}
	if lq.EventType != "" {
		q.cond("event_type = ?%d", lq.EventType)
	}
	if lq.ErrorContains != "" {
		q.conds = append(q.conds, c.contains(t.reason, q.arg(lq.ErrorContains)))
	}
}

// rank orders the sides at one instant in the newest-first order: the outbox's letters first.
func rank(t letterTable) int {
	if t.outbox {
		return 1
	}
	return 0
}

// olderThan adds the keyset condition "strictly older than cursor" for table t.
func (s *Store) olderThan(q *query, t letterTable, cur store.LetterCursor) {
	at, bound := cur.At, cur.ID
	if cur.IsZero() {
		at, bound = farFuture, math.MaxInt64
	} else {
		curRank := 0
		if cur.Outbox {
			curRank = 1
		}
		switch r := rank(t); {
		case r < curRank:
			bound = math.MaxInt64 // every letter of this side at that instant comes after the cursor
		case r > curRank:
			bound = 0 // none does
		}
	}
	// Not a row value: MySQL does not read (a, b) < (?, ?) as an index range.
	n := q.arg(s.d.Time(at))
	q.conds = append(q.conds, fmt.Sprintf("dead_lettered_at <= ?%d AND (dead_lettered_at < ?%d OR %s < ?%d)", n, n, t.id, q.arg(bound)))
}

// atOrNewer adds "at or newer than the position (at, id) of table t".
func (s *Store) atOrNewer(q *query, t letterTable, at time.Time, id int64) {
	n := q.arg(s.d.Time(at))
	q.conds = append(q.conds, fmt.Sprintf("dead_lettered_at >= ?%d AND (dead_lettered_at > ?%d OR %s >= ?%d)", n, n, t.id, q.arg(id)))
}

// sources are the tables a query reads.
func (s *Store) sources(lq store.LetterQuery) []letterTable {
	outbox, consumers := s.d.Console().tables()
	switch lq.Side {
	case store.SideOutbox:
		return []letterTable{outbox}
	case "":
		return []letterTable{outbox, consumers}
	}
	return []letterTable{consumers}
}

// position is a letter's place in the newest-first order.
type position struct {
	at   time.Time
	rank int
	id   int64
}

func (p position) newerThan(o position) bool {
	if !p.at.Equal(o.at) {
		return p.at.After(o.at)
	}
	if p.rank != o.rank {
		return p.rank > o.rank
	}
	return p.id > o.id
}

// scanBound finds where a bounded scan of t from the cursor stops: the position of the
// scanLimit-th letter of the indexed part of the selection; ok is false when fewer are left.
func (s *Store) scanBound(ctx context.Context, q0 dbexec.Querier, t letterTable, lq store.LetterQuery) (position, bool, error) {
	var q query
	s.selection(&q, t, lq, true)
	s.olderThan(&q, t, lq.Before)
	stmt := fmt.Sprintf("SELECT dead_lettered_at, %s FROM %s WHERE %s ORDER BY dead_lettered_at DESC, %s DESC LIMIT 1 OFFSET ?%d",
		t.id, t.scan, q.where(), t.id, q.arg(lq.ScanLimit-1))
	var (
		at dbexec.Time
		id int64
	)
	found, err := dbexec.FirstOf(ctx, q0, s.d.Console().render(stmt), q.args, &at, &id)
	return position{at: at.Time, rank: rank(t), id: id}, found, err
}

func positionOf(l store.DeadLetter) position {
	r := 0
	if l.Consumer == "" {
		r = 1
	}
	return position{at: l.DeadLetteredAt, rank: r, id: l.ID}
}
