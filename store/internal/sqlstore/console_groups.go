package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

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
