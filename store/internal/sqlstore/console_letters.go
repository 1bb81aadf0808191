package sqlstore

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

var _ store.Console = (*Store)(nil)

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

// scanLetters reads listColumns rows.
func (s *Store) scanLetters(ctx context.Context, db dbexec.Querier, stmt string, args []any) ([]store.DeadLetter, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, s.d.Classify(err)
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var l store.DeadLetter
		ls := letterScan{l: &l}
		if err := rows.Scan(ls.dest()...); err != nil {
			return nil, s.d.Classify(err)
		}
		ls.done()
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
