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

// ---- pauses and relays ----------------------------------------------------------------------

func (s *Store) Pauses(ctx context.Context) ([]store.Pause, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT scope, name, paused_by, reason, paused_at FROM {{schema}}.pauses ORDER BY scope, name`))
	if err != nil {
		return nil, fmt.Errorf("read pauses: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.Pause
	for rows.Next() {
		var (
			p  store.Pause
			at dbexec.Time
		)
		if err := rows.Scan(&p.Scope, &p.Name, &p.By, &p.Reason, &at); err != nil {
			return nil, fmt.Errorf("read pauses: %w", s.d.Classify(err))
		}
		p.At = at.Time
		out = append(out, p)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) SetPause(ctx context.Context, p store.Pause) (bool, error) {
	if p.Scope != store.PauseTopic && p.Scope != store.PauseRelay {
		return false, fmt.Errorf("pause: scope %q is neither %q nor %q", p.Scope, store.PauseTopic, store.PauseRelay)
	}
	c := s.d.Console()
	n, err := s.db.Exec(ctx, c.render(`{{insert_ignore}} {{schema}}.pauses (scope, name, paused_by, reason, paused_at)
VALUES (?1, ?2, ?3, ?4, ?5){{on_conflict_nothing}}`), p.Scope, p.Name, p.By, p.Reason, s.d.Time(p.At))
	if err != nil {
		return false, fmt.Errorf("pause %s %s: %w", p.Scope, p.Name, s.d.Classify(err))
	}
	return n == 1, nil
}

func (s *Store) ClearPause(ctx context.Context, scope, name string) (bool, error) {
	n, err := s.db.Exec(ctx, s.d.Console().render(`DELETE FROM {{schema}}.pauses WHERE scope = ?1 AND name = ?2`), scope, name)
	if err != nil {
		return false, fmt.Errorf("resume %s %s: %w", scope, name, s.d.Classify(err))
	}
	return n == 1, nil
}

// relayForgetAfter is how long a relay's last heartbeat is kept: a relay that stopped shows as
// gone meanwhile.
const relayForgetAfter = 24 * time.Hour

func (s *Store) RelayHeartbeat(ctx context.Context, b store.RelayBeat) error {
	c := s.d.Console()
	byTopic, err := json.Marshal(b.PublishedByTopic)
	if err != nil || b.PublishedByTopic == nil {
		byTopic = []byte("{}")
	}
	if _, err := s.db.Exec(ctx, c.render(c.UpsertRelay), b.Owner, b.Name, b.Host, b.PID, s.d.Time(b.Started), s.d.Time(b.At),
		s.d.NullTime(b.LastPass), s.d.NullTime(b.LastPublish), s.d.NullTime(b.CircuitOpenSince), b.Blocked, b.PublishedTotal,
		string(byTopic), s.d.NullTime(b.PausesSeen)); err != nil {
		return fmt.Errorf("record relay heartbeat: %w", s.d.Classify(err))
	}
	if _, err := s.db.Exec(ctx, c.render(`DELETE FROM {{schema}}.relays WHERE heartbeat_at < ?1`), s.d.Time(b.At.Add(-relayForgetAfter))); err != nil {
		return fmt.Errorf("forget old relays: %w", s.d.Classify(err))
	}
	return nil
}

func (s *Store) Relays(ctx context.Context) ([]store.RelayBeat, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT owner, name, host, pid, started_at, heartbeat_at, last_pass_at, last_publish_at,
    circuit_open_since, blocked, published_total, published_by_topic, pauses_seen_at
FROM {{schema}}.relays ORDER BY name, owner`))
	if err != nil {
		return nil, fmt.Errorf("read relays: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.RelayBeat
	for rows.Next() {
		var (
			b                                         store.RelayBeat
			started, at, pass, publish, circuit, seen dbexec.Time
			byTopic                                   []byte
		)
		if err := rows.Scan(&b.Owner, &b.Name, &b.Host, &b.PID, &started, &at, &pass, &publish, &circuit, &b.Blocked,
			&b.PublishedTotal, &byTopic, &seen); err != nil {
			return nil, fmt.Errorf("read relays: %w", s.d.Classify(err))
		}
		b.Started, b.At, b.LastPass, b.LastPublish, b.CircuitOpenSince, b.PausesSeen = started.Time, at.Time, pass.Time, publish.Time, circuit.Time, seen.Time
		_ = json.Unmarshal(byTopic, &b.PublishedByTopic)
		out = append(out, b)
	}
	return out, s.d.Classify(rows.Err())
}

// ---- overview -------------------------------------------------------------------------------

func (s *Store) TopicBacklog(ctx context.Context, headRows int) ([]store.TopicBacklog, bool, error) {
	// The oldest pending rows through the pending index, and no further: a backlog of millions
	// costs the same as one of headRows.
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT topic, count(*), min(created_at) FROM (
    SELECT topic, created_at FROM {{schema}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY seq LIMIT ?1
) AS head GROUP BY topic ORDER BY topic`), headRows)
	if err != nil {
		return nil, false, fmt.Errorf("read the outbox backlog: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var (
		out  []store.TopicBacklog
		read int64
	)
	for rows.Next() {
		var (
			t      store.TopicBacklog
			oldest dbexec.Time
		)
		if err := rows.Scan(&t.Topic, &t.Pending, &oldest); err != nil {
			return nil, false, fmt.Errorf("read the outbox backlog: %w", s.d.Classify(err))
		}
		t.OldestCreated = oldest.Time
		read += t.Pending
		out = append(out, t)
	}
	return out, read >= int64(headRows), s.d.Classify(rows.Err())
}

func (s *Store) ProcessedSince(ctx context.Context, since time.Time, capRows int) ([]store.ConsumerCount, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT consumer, count(*) FROM (
    SELECT consumer FROM {{schema}}.inbox WHERE processed_at >= ?1 LIMIT ?2
) AS recent GROUP BY consumer ORDER BY consumer`), s.d.Time(since), capRows)
	if err != nil {
		return nil, fmt.Errorf("count processed messages: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.ConsumerCount
	for rows.Next() {
		var c store.ConsumerCount
		if err := rows.Scan(&c.Consumer, &c.Count); err != nil {
			return nil, fmt.Errorf("count processed messages: %w", s.d.Classify(err))
		}
		out = append(out, c)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) ParkedCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT consumer, count(*) FROM {{schema}}.inbox_parked GROUP BY consumer`))
	if err != nil {
		return nil, fmt.Errorf("count parked messages: %w", s.d.Classify(err))
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			c string
			n int64
		)
		if err := rows.Scan(&c, &n); err != nil {
			return nil, fmt.Errorf("count parked messages: %w", s.d.Classify(err))
		}
		out[c] = n
	}
	return out, s.d.Classify(rows.Err())
}

// ---- jobs -----------------------------------------------------------------------------------

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
	switch {
	case nj.Filter.Side == store.SideOutbox:
		// Through the partial index on dead rows' seq; a row dead-lettered later is left out by
		// the snapshot's time.
		side, maxQuery = store.SideOutbox, `SELECT coalesce(max(seq), 0) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL`
	case nj.Filter.Side == "":
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
		var (
			d                                 store.DeadLetter
			dead, replayed, archived, created dbexec.Time
			metadata                          []byte
		)
		if err := rows.Scan(&d.ID, &d.Consumer, &d.Topic, &d.MessageID, &d.PartitionKey, &d.EventType, &d.Reason, &d.Attempts,
			&dead, &replayed, &archived, &d.FailureGroup, &d.PayloadSize, &created, &metadata, &d.Payload, &d.Reason, &d.SourceSeq); err != nil {
			return nil, fmt.Errorf("job %d: read letters: %w", l.ID, s.d.Classify(err))
		}
		d.DeadLetteredAt = dead.Time
		d.Metadata = decodeMetadata(metadata)
		if d.Payload == nil {
			d.Payload = []byte{}
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

// ---- audit ----------------------------------------------------------------------------------

func (s *Store) Audit(ctx context.Context, e store.AuditEntry) error {
	_, err := s.db.Exec(ctx, s.d.Console().render(`INSERT INTO {{schema}}.console_audit
    (at, actor, role, action, filter, matched, affected, job_id, result, ok) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`),
		s.d.Time(e.At), e.Actor, e.Role, e.Action, e.Filter, e.Matched, e.Affected, e.JobID, e.Result, e.OK)
	if err != nil {
		return fmt.Errorf("record the audit of %s by %s: %w", e.Action, e.Actor, s.d.Classify(err))
	}
	return nil
}

func (s *Store) AuditLog(ctx context.Context, before int64, limit int) ([]store.AuditEntry, error) {
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT id, at, actor, role, action, filter, matched, affected, job_id, result, ok
FROM {{schema}}.console_audit WHERE id < ?1 ORDER BY id DESC LIMIT ?2`), before, limit)
	if err != nil {
		return nil, fmt.Errorf("read the audit: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.AuditEntry
	for rows.Next() {
		var (
			e  store.AuditEntry
			at dbexec.Time
		)
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.Role, &e.Action, &e.Filter, &e.Matched, &e.Affected, &e.JobID, &e.Result, &e.OK); err != nil {
			return nil, fmt.Errorf("read the audit: %w", s.d.Classify(err))
		}
		e.At = at.Time
		out = append(out, e)
	}
	return out, s.d.Classify(rows.Err())
}
