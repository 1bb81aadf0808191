// A job's steps under its lease: each replays or archives the next letters of its frozen
// selection and moves its cursor past them, in one transaction (console_jobs.go holds the jobs
// themselves and their leases).

package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) StepOutboxJob(ctx context.Context, l store.JobLease, n int, now time.Time) (store.JobStep, error) {
	var step store.JobStep
	err := s.inTx(ctx, func(tx dbexec.Tx) error {
		if setup := s.d.Console().ReadSetup; setup != "" {
			if _, err := tx.Exec(ctx, setup); err != nil {
				return err
			}
		}
		j, err := s.lockedJob(ctx, tx, l)
		if err != nil {
			return err
		}
		outbox, _ := s.d.Console().tables()
		var q query
		s.selection(&q, outbox, snapshotted(j.Filter, j.SnapshotMaxID, j.SnapshotAt), false)
		q.cond("seq > ?%d", j.CursorSeq)
		q.cond("seq <= ?%d", j.SnapshotMaxID)
		// In seq order: within a key, an earlier row is never put back after a later one.
		rows, err := tx.Query(ctx, s.d.Console().render(fmt.Sprintf(`SELECT seq FROM %s WHERE %s ORDER BY seq LIMIT ?%d`,
			outbox.scan, q.where(), q.arg(n))), q.args...)
		if err != nil {
			return err
		}
		var seqs []int64
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, seq)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return err
		}
		step.Done = len(seqs) < n
		if len(seqs) > 0 {
			// A replay is the store's (ReplayOutboxDeadLetters): on Postgres it writes the row
			// again, so that a log relay reads it.
			apply, args := s.q.ReplayOutbox, []any{s.d.Int64s(seqs)}
			if j.Kind == store.JobArchive {
				apply = s.d.Console().render(`UPDATE {{schema}}.outbox SET archived_at = ?2
WHERE seq IN (?1) AND dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL`)
				args = append(args, s.d.Time(now))
			}
			applied, err := tx.Exec(ctx, apply, args...)
			if err != nil {
				return err
			}
			step.Applied, step.Skipped = applied, int64(len(seqs))-applied
			if _, err := tx.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.console_jobs
SET cursor_seq = ?4, applied = applied + ?5, skipped = skipped + ?6
WHERE id = ?1 AND owner = ?2 AND lease_token = ?3`), l.ID, l.Owner, l.Token, seqs[len(seqs)-1], step.Applied, step.Skipped); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrLeaseLost) {
		err = fmt.Errorf("job %d: %w", l.ID, err)
	}
	return step, err
}

func (s *Store) NextConsumerLetters(ctx context.Context, l store.JobLease, n int) (out []store.DeadLetter, err error) {
	err = s.reading(ctx, func(db dbexec.Querier) error {
		var err error
		out, err = s.nextConsumerLetters(ctx, db, l, n)
		return err
	})
	return out, err
}

func (s *Store) nextConsumerLetters(ctx context.Context, db dbexec.Querier, l store.JobLease, n int) ([]store.DeadLetter, error) {
	j, err := s.Job(ctx, l.ID)
	if err != nil {
		return nil, err
	}
	if j.Owner != l.Owner || j.LeaseToken != l.Token {
		return nil, store.ErrLeaseLost
	}
	_, consumers := s.d.Console().tables()
	var q query
	q.arg(1 << 30) // ?1: the payload's length bound of detailColumns: all of it
	s.selection(&q, consumers, snapshotted(j.Filter, j.SnapshotMaxID, j.SnapshotAt), false)
	q.cond("id <= ?%d", j.SnapshotMaxID)
	a := q.arg(j.CursorSeq)
	q.conds = append(q.conds, fmt.Sprintf("source_seq >= ?%d AND (source_seq > ?%d OR id > ?%d)", a, a, q.arg(j.CursorID)))
	// Each key's letters in their outbox order (source_seq), letters of other producers (0) first.
	stmt := fmt.Sprintf(`SELECT %s, l.reason, l.source_seq FROM {{schema}}.dead_letters AS l WHERE %s ORDER BY l.source_seq, l.id LIMIT ?%d`,
		detailColumns(consumers), q.where(), q.arg(n))
	rows, err := db.Query(ctx, s.d.Console().render(stmt), q.args...)
	if err != nil {
		return nil, fmt.Errorf("job %d: read letters: %w", l.ID, s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var d store.DeadLetter
		if err := scanDetail(rows, &d, &d.SourceSeq); err != nil {
			return nil, fmt.Errorf("job %d: read letters: %w", l.ID, s.d.Classify(err))
		}
		out = append(out, d)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) ResetLetterDeliveries(ctx context.Context, letters []store.DeadLetter) error {
	for _, d := range letters {
		if err := s.ResetDeliveries(ctx, d.Consumer, d.MessageID); err != nil {
			return fmt.Errorf("reset the deliveries of dead letter %d: %w", d.ID, err)
		}
	}
	return nil
}

func (s *Store) CommitConsumerLetters(ctx context.Context, l store.JobLease, sent, failed []store.DeadLetter, now time.Time) (store.JobStep, error) {
	var step store.JobStep
	err := s.inTx(ctx, func(tx dbexec.Tx) error {
		j, err := s.lockedJob(ctx, tx, l)
		if err != nil {
			return err
		}
		cursorSeq, cursorID := j.CursorSeq, j.CursorID
		for _, d := range append(append([]store.DeadLetter(nil), sent...), failed...) {
			if d.SourceSeq > cursorSeq || (d.SourceSeq == cursorSeq && d.ID > cursorID) {
				cursorSeq, cursorID = d.SourceSeq, d.ID
			}
		}
		if len(sent) > 0 {
			ids := make([]int64, len(sent))
			for i, d := range sent {
				ids[i] = d.ID
			}
			column := "replayed_at"
			if j.Kind == store.JobArchive {
				column = "archived_at"
			}
			applied, err := tx.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.dead_letters SET `+column+` = ?2
WHERE id IN (?1) AND {{dead_waiting}}`), s.d.Int64s(ids), s.d.Time(now))
			if err != nil {
				return err
			}
			step.Applied, step.Skipped = applied, int64(len(sent))-applied
		}
		_, err = tx.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.console_jobs
SET cursor_seq = ?4, cursor_id = ?5, applied = applied + ?6, skipped = skipped + ?7, failed = failed + ?8
WHERE id = ?1 AND owner = ?2 AND lease_token = ?3`), l.ID, l.Owner, l.Token, cursorSeq, cursorID, step.Applied, step.Skipped, int64(len(failed)))
		return err
	})
	if err != nil && !errors.Is(err, store.ErrLeaseLost) {
		err = fmt.Errorf("job %d: %w", l.ID, err)
	}
	return step, err
}
