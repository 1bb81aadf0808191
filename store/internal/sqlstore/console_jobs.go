package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

const jobColumns = `id, kind, side, filter, snapshot_max_id, snapshot_at, rate, expected, total, state, cursor_seq, cursor_id,
    applied, skipped, failed, owner, lease_until, lease_token, created_by, created_at, started_at, finished_at, cancel_by,
    cancel_at, waiting, last_error`

func scanJob(row dbexec.Row) (store.Job, error) {
	var (
		j                                            store.Job
		filter                                       []byte
		snap, lease, created, started, finished, cnc dbexec.Time
	)
	err := row.Scan(&j.ID, &j.Kind, &j.Side, &filter, &j.SnapshotMaxID, &snap, &j.Rate, &j.Expected, &j.Total, &j.State,
		&j.CursorSeq, &j.CursorID, &j.Applied, &j.Skipped, &j.Failed, &j.Owner, &lease, &j.LeaseToken, &j.CreatedBy, &created,
		&started, &finished, &j.CancelBy, &cnc, &j.Waiting, &j.LastError)
	if err != nil {
		return j, err
	}
	j.SnapshotAt, j.LeaseUntil, j.CreatedAt, j.StartedAt, j.FinishedAt, j.CancelAt = snap.Time, lease.Time, created.Time, started.Time, finished.Time, cnc.Time
	if err := json.Unmarshal(filter, &j.Filter); err != nil {
		return j, fmt.Errorf("job %d: its filter %q is not JSON: %w", j.ID, filter, err)
	}
	return j, nil
}

func (s *Store) CreateJob(ctx context.Context, nj store.NewJob) (store.Job, bool, error) {
	c := s.d.Console()
	if nj.Kind != store.JobReplay && nj.Kind != store.JobArchive {
		return store.Job{}, false, fmt.Errorf("create job: kind %q is neither replay nor archive", nj.Kind)
	}
	side, maxQuery := store.SideConsumers, `SELECT coalesce(max(id), 0) FROM {{schema}}.dead_letters`
	switch nj.Filter.Side {
	case store.SideOutbox:
		// Through the partial index on dead rows' seq; a row dead-lettered later is left out by
		// the snapshot's time.
		side, maxQuery = store.SideOutbox, `SELECT coalesce(max(seq), 0) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL`
	case "":
		return store.Job{}, false, errors.New("create job: a job runs on one side: the outbox, one consumer, or every consumer")
	}
	if nj.Filter.Archived {
		return store.Job{}, false, errors.New("create job: archived letters are never replayed or archived again")
	}
	if nj.RequestKey == "" {
		return store.Job{}, false, errors.New("create job: a request key is required (it makes a form sent twice one job)")
	}
	var snapMax int64
	if err := s.db.QueryRow(ctx, c.render(maxQuery)).Scan(&snapMax); err != nil {
		return store.Job{}, false, fmt.Errorf("create job: %w", s.d.Classify(err))
	}
	filter := nj.Filter
	filter.Before, filter.Limit, filter.ScanLimit = store.LetterCursor{}, 0, 0
	total, _, err := s.CountDeadLetters(ctx, snapshotted(filter, snapMax, nj.Now), -1)
	if err != nil {
		return store.Job{}, false, fmt.Errorf("create job: %w", err)
	}
	fj, err := json.Marshal(filter)
	if err != nil {
		return store.Job{}, false, err
	}
	n, err := s.db.Exec(ctx, c.render(`{{insert_ignore}} {{schema}}.console_jobs
    (kind, side, filter, request_key, snapshot_max_id, snapshot_at, rate, expected, total, state, created_by, created_at, waiting, last_error)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'queued', ?10, ?11, '', ''){{on_conflict_nothing}}`),
		nj.Kind, side, string(fj), nj.RequestKey, snapMax, s.d.Time(nj.Now), nj.Rate, nj.Expected, total, nj.By, s.d.Time(nj.Now))
	if err != nil {
		return store.Job{}, false, fmt.Errorf("create job: %w", s.d.Classify(err))
	}
	j, err := scanJob(s.db.QueryRow(ctx, c.render(`SELECT `+jobColumns+` FROM {{schema}}.console_jobs WHERE request_key = ?1`), nj.RequestKey))
	if err != nil {
		return j, false, fmt.Errorf("create job: %w", s.d.Classify(err))
	}
	return j, n == 1, nil
}

// snapshotted is a job's selection as frozen when it was created: letters no newer than then.
// The id bound is applied by the job's own statements; Until stands for the time bound here.
func snapshotted(f store.LetterQuery, _ int64, at time.Time) store.LetterQuery {
	if f.Until.IsZero() || f.Until.After(at) {
		f.Until = at.Add(time.Microsecond) // dead-lettered at or before the snapshot
	}
	return f
}

func (s *Store) Job(ctx context.Context, id int64) (store.Job, error) {
	j, err := scanJob(s.db.QueryRow(ctx, s.d.Console().render(`SELECT `+jobColumns+` FROM {{schema}}.console_jobs WHERE id = ?1`), id))
	if errors.Is(err, dbexec.ErrNoRows) {
		return j, store.ErrNoJob
	}
	if err != nil {
		return j, fmt.Errorf("read job %d: %w", id, s.d.Classify(err))
	}
	return j, nil
}

func (s *Store) Jobs(ctx context.Context, before int64, limit int) ([]store.Job, error) {
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT `+jobColumns+` FROM {{schema}}.console_jobs WHERE id < ?1 ORDER BY id DESC LIMIT ?2`), before, limit)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", s.d.Classify(err))
		}
		out = append(out, j)
	}
	return out, s.d.Classify(rows.Err())
}

const openStates = `('queued', 'running', 'waiting', 'cancelling')`

func (s *Store) ClaimJob(ctx context.Context, owner string, now time.Time, lease time.Duration) (store.Job, bool, error) {
	var id int64
	found, err := dbexec.FirstOf(ctx, s.db, s.d.Console().render(`SELECT id FROM {{schema}}.console_jobs WHERE state IN `+openStates+`
AND (lease_until IS NULL OR lease_until < ?1) ORDER BY id LIMIT 1`), []any{s.d.Time(now)}, &id)
	if err != nil || !found {
		return store.Job{}, false, s.d.Classify(err)
	}
	return s.TakeJob(ctx, id, owner, now, lease)
}

func (s *Store) TakeJob(ctx context.Context, id int64, owner string, now time.Time, lease time.Duration) (store.Job, bool, error) {
	c := s.d.Console()
	// The lease is taken by a conditional UPDATE: of two consoles that saw the same job free, the
	// database lets one change the row, and the other's condition then fails.
	n, err := s.db.Exec(ctx, c.render(`UPDATE {{schema}}.console_jobs
SET started_at = coalesce(started_at, ?3), owner = ?2, lease_until = ?4, lease_token = lease_token + 1,
    state = CASE WHEN state = 'queued' THEN 'running' ELSE state END
WHERE id = ?1 AND state IN `+openStates+` AND (lease_until IS NULL OR lease_until < ?3)`),
		id, owner, s.d.Time(now), s.d.Time(now.Add(lease)))
	if err != nil {
		return store.Job{}, false, fmt.Errorf("claim job %d: %w", id, s.d.Classify(err))
	}
	if n == 0 {
		return store.Job{}, false, nil
	}
	j, err := s.Job(ctx, id)
	return j, err == nil, err
}

func (s *Store) RenewJob(ctx context.Context, l store.JobLease, until time.Time, waiting string) (store.Job, error) {
	n, err := s.db.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.console_jobs
SET lease_until = ?4, waiting = ?5,
    state = CASE WHEN state IN ('running', 'waiting') THEN (CASE WHEN ?5 = '' THEN 'running' ELSE 'waiting' END) ELSE state END
WHERE id = ?1 AND owner = ?2 AND lease_token = ?3`), l.ID, l.Owner, l.Token, s.d.Time(until), waiting)
	if err != nil {
		return store.Job{}, fmt.Errorf("renew job %d: %w", l.ID, s.d.Classify(err))
	}
	if n == 0 {
		return store.Job{}, store.ErrLeaseLost
	}
	return s.Job(ctx, l.ID)
}

// lockedJob reads the job in tx, locked where the database locks rows, if l still holds it.
func (s *Store) lockedJob(ctx context.Context, tx dbexec.Tx, l store.JobLease) (store.Job, error) {
	j, err := scanJob(tx.QueryRow(ctx, s.d.Console().render(`SELECT `+jobColumns+` FROM {{schema}}.console_jobs
WHERE id = ?1 AND owner = ?2 AND lease_token = ?3{{for_update}}`), l.ID, l.Owner, l.Token))
	if errors.Is(err, dbexec.ErrNoRows) {
		return j, store.ErrLeaseLost
	}
	return j, err
}

func (s *Store) FinishJob(ctx context.Context, l store.JobLease, state, lastError string, now time.Time) error {
	// Letters of the frozen selection the job did not reach as waiting were replayed or archived
	// meanwhile: skipped, a no-op.
	n, err := s.db.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.console_jobs
SET finished_at = ?6, waiting = '', lease_until = NULL, last_error = ?5,
    skipped = CASE WHEN total > applied + failed THEN total - applied - failed ELSE skipped END,
    state = ?4
WHERE id = ?1 AND owner = ?2 AND lease_token = ?3`), l.ID, l.Owner, l.Token, state, lastError, s.d.Time(now))
	if err != nil {
		return fmt.Errorf("finish job %d: %w", l.ID, s.d.Classify(err))
	}
	if n == 0 {
		return store.ErrLeaseLost
	}
	return nil
}

func (s *Store) RequestCancel(ctx context.Context, id int64, by string, now time.Time) (bool, error) {
	// MySQL evaluates SET left to right with the new values: state goes last.
	n, err := s.db.Exec(ctx, s.d.Console().render(`UPDATE {{schema}}.console_jobs
SET cancel_by = ?2, cancel_at = ?3,
    finished_at = CASE WHEN state = 'queued' THEN ?3 ELSE finished_at END,
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE 'cancelling' END
WHERE id = ?1 AND state IN `+openStates), id, by, s.d.Time(now))
	if err != nil {
		return false, fmt.Errorf("cancel job %d: %w", id, s.d.Classify(err))
	}
	return n == 1, nil
}
