package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

var _ store.Console = (*Store)(nil)

// reading runs a console read, in a transaction set up by the dialect's ReadSetup when it has one.
func (s *Store) reading(ctx context.Context, fn func(q dbexec.Querier) error) error {
	setup := s.d.Console().ReadSetup
	if setup == "" {
		return fn(s.db)
	}
	tx, err := s.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return s.d.Classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, setup); err != nil {
		return s.d.Classify(err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return s.d.Classify(tx.Commit(ctx))
}

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
	switch {
	case lq.Side == store.SideOutbox:
		return []letterTable{outbox}
	case lq.Side == "":
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

func (s *Store) ListDeadLetters(ctx context.Context, lq store.LetterQuery) (page store.LetterPage, err error) {
	err = s.reading(ctx, func(db dbexec.Querier) error {
		var err error
		page, err = s.listDeadLetters(ctx, db, lq)
		return err
	})
	return page, err
}

func (s *Store) listDeadLetters(ctx context.Context, db dbexec.Querier, lq store.LetterQuery) (store.LetterPage, error) {
	if lq.Limit <= 0 {
		lq.Limit = 50
	}
	var page store.LetterPage
	sources := s.sources(lq)
	// A selection no index serves reads at most ScanLimit letters per side; the page is complete
	// only down to the newest of the sides' bounds.
	var (
		cutoff    position
		hasCutoff bool
	)
	if lq.Unindexed() && lq.ScanLimit > 0 {
		for _, t := range sources {
			b, ok, err := s.scanBound(ctx, db, t, lq)
			if err != nil {
				return page, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
			}
			if ok && (!hasCutoff || b.newerThan(cutoff)) {
				cutoff, hasCutoff = b, true
			}
		}
	}
	var all []store.DeadLetter
	for _, t := range sources {
		var q query
		s.selection(&q, t, lq, false)
		s.olderThan(&q, t, lq.Before)
		if hasCutoff {
			if cutoff.rank == rank(t) {
				s.atOrNewer(&q, t, cutoff.at, cutoff.id)
			} else if cutoff.rank > rank(t) {
				s.atOrNewer(&q, t, cutoff.at.Add(time.Microsecond), 0) // strictly after the instant
			} else {
				s.atOrNewer(&q, t, cutoff.at, 0) // the whole instant
			}
		}
		// A deferred join: the inner query reads only the index (InnoDB's secondary entries carry
		// the key), the outer one the page's rows by key — MySQL otherwise reads every newer row.
		// The outer condition lets Postgres find outbox rows by seq through the partial index on
		// dead rows (seq is not the outbox's key).
		outer := ""
		if t.outbox {
			outer = " AND l.dead_lettered_at IS NOT NULL AND l.published_at IS NULL"
		}
		stmt := fmt.Sprintf(`SELECT %s FROM %s AS l JOIN (SELECT %s FROM %s WHERE %s ORDER BY dead_lettered_at DESC, %s DESC LIMIT ?%d) AS k
ON l.%s = k.%s%s ORDER BY l.dead_lettered_at DESC, l.%s DESC`,
			t.listColumns("l"), t.table, t.id, t.scan, q.where(), t.id, q.arg(lq.Limit+1), t.id, t.id, outer, t.id)
		letters, err := s.scanLetters(ctx, db, s.d.Console().render(stmt), q.args)
		if err != nil {
			return page, fmt.Errorf("list dead letters: %w", err)
		}
		all = append(all, letters...)
	}
	sort.SliceStable(all, func(i, j int) bool { return positionOf(all[i]).newerThan(positionOf(all[j])) })
	if len(all) > lq.Limit {
		page.Letters = all[:lq.Limit]
		last := all[lq.Limit-1]
		page.Next = store.LetterCursor{At: last.DeadLetteredAt, Outbox: last.Consumer == "", ID: last.ID}
		return page, nil
	}
	page.Letters = all
	if hasCutoff {
		page.ScanStopped = true
		page.Scanned = lq.ScanLimit
		page.Next = store.LetterCursor{At: cutoff.at, Outbox: cutoff.rank == 1, ID: cutoff.id}
	}
	return page, nil
}

func positionOf(l store.DeadLetter) position {
	r := 0
	if l.Consumer == "" {
		r = 1
	}
	return position{at: l.DeadLetteredAt, rank: r, id: l.ID}
}

// scanLetters reads listColumns rows.
func (s *Store) scanLetters(ctx context.Context, db dbexec.Querier, stmt string, args []any) ([]store.DeadLetter, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, s.d.Classify(err)
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var (
			l                                 store.DeadLetter
			dead, replayed, archived, created dbexec.Time
		)
		if err := rows.Scan(&l.ID, &l.Consumer, &l.Topic, &l.MessageID, &l.PartitionKey, &l.EventType, &l.Reason, &l.Attempts,
			&dead, &replayed, &archived, &l.FailureGroup, &l.PayloadSize, &created); err != nil {
			return nil, s.d.Classify(err)
		}
		l.DeadLetteredAt, l.ReplayedAt, l.ArchivedAt, l.CreatedAt = dead.Time, replayed.Time, archived.Time, created.Time
		out = append(out, l)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) CountDeadLetters(ctx context.Context, lq store.LetterQuery, limit int) (n int64, capped bool, err error) {
	err = s.reading(ctx, func(db dbexec.Querier) error {
		var err error
		n, capped, err = s.countDeadLetters(ctx, db, lq, limit)
		return err
	})
	return n, capped, err
}

func (s *Store) countDeadLetters(ctx context.Context, db dbexec.Querier, lq store.LetterQuery, limit int) (int64, bool, error) {
	var total int64
	for _, t := range s.sources(lq) {
		var q query
		s.selection(&q, t, lq, false)
		stmt := fmt.Sprintf("SELECT count(*) FROM %s WHERE %s", t.scan, q.where())
		if limit >= 0 {
			stmt = fmt.Sprintf("SELECT count(*) FROM (SELECT 1 AS one FROM %s WHERE %s LIMIT ?%d) AS capped", t.scan, q.where(), q.arg(limit+1))
		}
		var n int64
		if err := db.QueryRow(ctx, s.d.Console().render(stmt), q.args...).Scan(&n); err != nil {
			return 0, false, fmt.Errorf("count dead letters: %w", s.d.Classify(err))
		}
		total += n
	}
	if limit >= 0 && total > int64(limit) {
		return int64(limit), true, nil
	}
	return total, false, nil
}

func (s *Store) GroupCounts(ctx context.Context, lq store.LetterQuery, scanLimit int) (out []store.GroupCount, err error) {
	err = s.reading(ctx, func(db dbexec.Querier) error {
		var err error
		out, err = s.groupCounts(ctx, db, lq, scanLimit)
		return err
	})
	return out, err
}

func (s *Store) groupCounts(ctx context.Context, db dbexec.Querier, lq store.LetterQuery, scanLimit int) ([]store.GroupCount, error) {
	lq.Before, lq.Archived = store.LetterCursor{}, false
	var out []store.GroupCount
	for _, t := range s.sources(lq) {
		var q query
		s.selection(&q, t, lq, false)
		if lq.Unindexed() && scanLimit > 0 {
			lq.ScanLimit = scanLimit
			b, ok, err := s.scanBound(ctx, db, t, lq)
			if err != nil {
				return nil, fmt.Errorf("count failure groups: %w", s.d.Classify(err))
			}
			if ok {
				s.atOrNewer(&q, t, b.at, b.id)
			}
		}
		side := "consumer"
		if t.outbox {
			side = "''"
		}
		stmt := fmt.Sprintf(`SELECT %s, coalesce(failure_group, 0), count(*), min(dead_lettered_at), max(dead_lettered_at)
FROM %s WHERE %s GROUP BY %s, failure_group`, side, t.scan, q.where(), side)
		if t.outbox {
			stmt = fmt.Sprintf(`SELECT '', coalesce(failure_group, 0), count(*), min(dead_lettered_at), max(dead_lettered_at)
FROM %s WHERE %s GROUP BY failure_group`, t.scan, q.where())
		}
		rows, err := db.Query(ctx, s.d.Console().render(stmt), q.args...)
		if err != nil {
			return nil, fmt.Errorf("count failure groups: %w", s.d.Classify(err))
		}
		for rows.Next() {
			var (
				g           store.GroupCount
				first, last dbexec.Time
			)
			if err := rows.Scan(&g.Side, &g.FailureGroup, &g.Count, &first, &last); err != nil {
				rows.Close()
				return nil, fmt.Errorf("count failure groups: %w", s.d.Classify(err))
			}
			if g.Side == "" {
				g.Side = store.SideOutbox
			}
			g.First, g.Last = first.Time, last.Time
			out = append(out, g)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("count failure groups: %w", s.d.Classify(err))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Last.After(out[j].Last)
	})
	return out, nil
}

// detailColumns are listColumns, then the metadata and the payload's first ?1 bytes.
func detailColumns(t letterTable) string {
	return t.listColumns("l") + ", l.metadata, substr(l.payload, 1, ?1)"
}

func (s *Store) readDetail(ctx context.Context, t letterTable, cond string, args []any) (store.DeadLetter, error) {
	stmt := fmt.Sprintf("SELECT %s, coalesce(%s, '') FROM %s AS l WHERE %s", detailColumns(t), "l."+t.reason, t.table, cond)
	if !t.outbox {
		stmt = fmt.Sprintf("SELECT %s, l.reason FROM %s AS l WHERE %s", detailColumns(t), t.table, cond)
	}
	row := s.db.QueryRow(ctx, s.d.Console().render(stmt+" LIMIT 1"), args...)
	var (
		l                                 store.DeadLetter
		dead, replayed, archived, created dbexec.Time
		metadata                          []byte
	)
	err := row.Scan(&l.ID, &l.Consumer, &l.Topic, &l.MessageID, &l.PartitionKey, &l.EventType, &l.Reason, &l.Attempts,
		&dead, &replayed, &archived, &l.FailureGroup, &l.PayloadSize, &created, &metadata, &l.Payload, &l.Reason)
	if errors.Is(err, dbexec.ErrNoRows) {
		return l, store.ErrNoLetter
	}
	if err != nil {
		return l, s.d.Classify(err)
	}
	l.DeadLetteredAt, l.ReplayedAt, l.ArchivedAt, l.CreatedAt = dead.Time, replayed.Time, archived.Time, created.Time
	l.Metadata = decodeMetadata(metadata)
	if l.Payload == nil {
		l.Payload = []byte{}
	}
	return l, nil
}

func (s *Store) DeadLetter(ctx context.Context, side string, id int64, payloadMax int) (store.DeadLetter, error) {
	outbox, consumers := s.d.Console().tables()
	var (
		l   store.DeadLetter
		err error
	)
	if side == store.SideOutbox {
		// Dead-lettered, or archived: through the partial index on dead rows' seq.
		l, err = s.readDetail(ctx, outbox, "l.seq = ?2 AND l.dead_lettered_at IS NOT NULL AND l.published_at IS NULL", []any{payloadMax, id})
	} else {
		l, err = s.readDetail(ctx, consumers, "l.id = ?2 AND l.consumer = ?3", []any{payloadMax, id, side})
	}
	if err != nil && !errors.Is(err, store.ErrNoLetter) {
		err = fmt.Errorf("read dead letter %s #%d: %w", side, id, err)
	}
	return l, err
}

func (s *Store) DeadLetterPayload(ctx context.Context, side string, id int64) ([]byte, error) {
	l, err := s.DeadLetter(ctx, side, id, math.MaxInt32)
	return l.Payload, err
}

func (s *Store) GroupExample(ctx context.Context, side string, group int64) (store.DeadLetter, error) {
	outbox, consumers := s.d.Console().tables()
	cond, args := "l.failure_group = ?2", []any{4096, group}
	if group == 0 {
		cond, args = "l.failure_group IS NULL", []any{4096}
	}
	if side == store.SideOutbox {
		return s.readDetail(ctx, outbox, cond+" AND l.dead_lettered_at IS NOT NULL AND l.published_at IS NULL", args)
	}
	return s.readDetail(ctx, consumers, cond+fmt.Sprintf(" AND l.consumer = ?%d", len(args)+1), append(args, side))
}

func (s *Store) DeadLetterTotals(ctx context.Context) ([]store.SideTotal, error) {
	c := s.d.Console()
	var out []store.SideTotal
	read := func(stmt string, outbox bool) error {
		rows, err := s.db.Query(ctx, c.render(stmt))
		if err != nil {
			return s.d.Classify(err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				t      store.SideTotal
				name   string
				oldest dbexec.Time
			)
			if err := rows.Scan(&name, &t.Count, &oldest); err != nil {
				return s.d.Classify(err)
			}
			t.Side, t.Oldest = name, oldest.Time
			if outbox {
				t.Side, t.Topic = store.SideOutbox, name
			}
			out = append(out, t)
		}
		return s.d.Classify(rows.Err())
	}
	if err := read(`SELECT consumer, count(*), min(dead_lettered_at) FROM {{schema}}.dead_letters WHERE {{dead_waiting}} GROUP BY consumer`, false); err != nil {
		return nil, fmt.Errorf("count dead letters per consumer: %w", err)
	}
	if err := read(`SELECT topic, count(*), min(dead_lettered_at) FROM {{schema}}.outbox
WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL GROUP BY topic`, true); err != nil {
		return nil, fmt.Errorf("count outbox dead letters per topic: %w", err)
	}
	return out, nil
}

// LetterFacts are what a dead letter is filed under, read from its metadata and its error in Go,
// so that every database files the same letter the same way.
type LetterFacts struct {
	PartitionKey any // nil for none
	EventType    any
	FailureGroup int64
	SourceSeq    int64
}

// FactsOf reads a letter's facts from its metadata (a JSON object of strings; anything else gives
// none) and its error.
func FactsOf(metadata []byte, errText string) LetterFacts {
	var md map[string]string
	_ = json.Unmarshal(metadata, &md) // not an object of strings: no facts, the error still groups it
	var f LetterFacts
	if k := md["outboxkit_partition_key"]; k != "" {
		f.PartitionKey = k
	}
	eventType := md["outboxkit_event_type"]
	if eventType != "" {
		f.EventType = eventType
	}
	if seq, err := strconv.ParseInt(md["outboxkit_seq"], 10, 64); err == nil && seq > 0 {
		f.SourceSeq = seq
	}
	f.FailureGroup, _ = store.FailureGroupOf(eventType, errText)
	return f
}

func (s *Store) Regroup(ctx context.Context, batch int) (int, error) {
	c := s.d.Console()
	done := 0
	type ungrouped struct {
		id       int64
		reason   string
		metadata []byte
	}
	readBatch := func(stmt string) ([]ungrouped, error) {
		rows, err := s.db.Query(ctx, c.render(stmt), batch)
		if err != nil {
			return nil, s.d.Classify(err)
		}
		defer rows.Close()
		var out []ungrouped
		for rows.Next() {
			var u ungrouped
			if err := rows.Scan(&u.id, &u.reason, &u.metadata); err != nil {
				return nil, s.d.Classify(err)
			}
			out = append(out, u)
		}
		return out, s.d.Classify(rows.Err())
	}
	letters, err := readBatch(`SELECT id, reason, metadata FROM {{schema}}.dead_letters WHERE failure_group IS NULL ORDER BY id LIMIT ?1`)
	if err != nil {
		return 0, fmt.Errorf("regroup dead letters: %w", err)
	}
	update := c.render(`UPDATE {{schema}}.dead_letters SET failure_group = ?1, event_type = ?2, partition_key = ?3, source_seq = ?4
WHERE id = ?5 AND failure_group IS NULL`)
	for _, u := range letters {
		f := FactsOf(u.metadata, u.reason)
		if _, err := s.db.Exec(ctx, update, f.FailureGroup, f.EventType, f.PartitionKey, f.SourceSeq, u.id); err != nil {
			return done, fmt.Errorf("regroup dead letter %d: %w", u.id, s.d.Classify(err))
		}
		done++
	}
	rows, err := readBatch(`SELECT seq, coalesce(last_error, ''), metadata FROM {{schema}}.outbox
WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND failure_group IS NULL ORDER BY seq LIMIT ?1`)
	if err != nil {
		return done, fmt.Errorf("regroup outbox dead letters: %w", err)
	}
	update = c.render(`UPDATE {{schema}}.outbox SET failure_group = ?1, event_type = ?2 WHERE seq = ?3 AND failure_group IS NULL`)
	for _, u := range rows {
		f := FactsOf(u.metadata, u.reason)
		if _, err := s.db.Exec(ctx, update, f.FailureGroup, f.EventType, u.id); err != nil {
			return done, fmt.Errorf("regroup outbox dead letter %d: %w", u.id, s.d.Classify(err))
		}
		done++
	}
	return done, nil
}

// groupDeadRows files the outbox rows a pass dead-lettered under their failure group and event
// type, in the pass's transaction: their metadata is read back (the outcome carries errors only).
func groupDeadRows(ctx context.Context, q dbexec.Querier, d Dialect, failed []store.FailedRow) error {
	c := d.Console()
	var dead []int64
	errText := map[int64]string{}
	for _, f := range failed {
		if f.DeadLettered {
			dead = append(dead, f.Seq)
			errText[f.Seq] = f.Error
		}
	}
	if len(dead) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, c.render(`SELECT seq, metadata FROM {{schema}}.outbox WHERE seq IN (?1)`), d.Int64s(dead))
	if err != nil {
		return err
	}
	facts := map[int64]LetterFacts{}
	for rows.Next() {
		var (
			seq      int64
			metadata []byte
		)
		if err := rows.Scan(&seq, &metadata); err != nil {
			rows.Close()
			return err
		}
		facts[seq] = FactsOf(metadata, errText[seq])
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return err
	}
	update := c.render(`UPDATE {{schema}}.outbox SET failure_group = ?1, event_type = ?2 WHERE seq = ?3`)
	for _, seq := range dead {
		f := facts[seq]
		if _, err := q.Exec(ctx, update, f.FailureGroup, f.EventType, seq); err != nil {
			return err
		}
	}
	return nil
}
