package mysqlbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// timeText is how the relay passes a time: UTC, whatever the connection's time zone.
func timeText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }

// checkpoint is a relay group's checkpoint row.
type checkpoint struct {
	exists     bool
	flavor     string
	progress   string // "gtid" or "file"
	pos        position
	backfilled bool
}

func (r *Relay) readCheckpoint(ctx context.Context, q querier) (checkpoint, error) {
	var (
		cp         checkpoint
		pos        uint64
		backfilled int
	)
	err := q.QueryRowContext(ctx, r.sql.readCheckpoint, r.fcfg.Name).Scan(&cp.flavor, &cp.progress, &cp.pos.gtid, &cp.pos.file, &pos, &backfilled)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, nil
	}
	if err != nil {
		return cp, fmt.Errorf("read the relay group's checkpoint: %w", err)
	}
	cp.exists, cp.pos.pos, cp.backfilled = true, uint32(pos), backfilled == 1
	return cp, nil
}

// querier is a connection or a transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (r *Relay) writeCheckpoint(ctx context.Context, q querier, st settings, progress string, p position, backfilled bool) error {
	b := 0
	if backfilled {
		b = 1
	}
	_, err := q.ExecContext(ctx, r.sql.writeCkpt, r.fcfg.Name, st.flavor, r.serverID, progress, p.gtid, p.file, p.pos, b, timeText(time.Now()))
	if err != nil {
		return fmt.Errorf("record the relay group's checkpoint: %w", err)
	}
	return nil
}

// readBackingOff reads the rows whose failed attempts are recorded in the outbox.
func (r *Relay) readBackingOff(ctx context.Context, db *sql.DB) (map[int64]attempt, error) {
	rows, err := db.QueryContext(ctx, r.sql.backingOff)
	if err != nil {
		return nil, fmt.Errorf("read the rows backing off: %w", err)
	}
	defer rows.Close()
	out := map[int64]attempt{}
	for rows.Next() {
		var (
			seq  int64
			a    attempt
			next string
		)
		if err := rows.Scan(&seq, &a.attempts, &next); err != nil {
			return nil, fmt.Errorf("read the rows backing off: %w", err)
		}
		if a.nextAt, err = time.ParseInLocation(layout, next, time.UTC); err != nil {
			return nil, fmt.Errorf("read the rows backing off: next_attempt_at %q: %w", next, err)
		}
		out[seq] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the rows backing off: %w", err)
	}
	return out, nil
}

// checkpointState is what the next checkpoint writes: the published rows to remove, the dead
// letters and failed attempts to record, and the position they are all behind.
type checkpointState struct {
	gtids      gtidPosition // the GTID set read up to; nil where progress is tracked by file
	pos        position     // where the last transaction behind the checkpoint ends
	backfilled bool
	dirty      bool // passed a transaction not its own since the last checkpoint
	written    struct {
		backfilled bool
	}
	del      []int64 // published rows' seqs
	dead     []*entry
	failures map[int64]*entry // rows that back off, by seq: their attempt recorded
	// A transaction's published rows and dead letters wait for its end to pass: a relay starting
	// again reads the log from the checkpoint, and must find there again every row that is not
	// removed or dead-lettered.
	txnDel  []int64
	txnDead []*entry
	last    time.Time // when the last checkpoint was written
}

// due reports whether a checkpoint is to be written now.
func (c *checkpointState) due(cfg Config, now time.Time) bool {
	rows := len(c.del) + len(c.dead)
	if rows >= cfg.FlushRows {
		return true
	}
	if now.Sub(c.last) < cfg.FlushInterval {
		return false
	}
	return rows > 0 || len(c.failures) > 0 || c.dirty || c.backfilled != c.written.backfilled
}

// flush removes the published rows, records the dead letters and failed attempts, and records
// the position they are behind, in one transaction on the connection that holds the group's
// lock: a relay that lost the lock (its connection gone) can write no checkpoint, nor one that
// found it lost (the lock's watchdog). MySQL has no statement that writes two tables (Postgres's
// data-modifying WITH): the transaction is what makes the removal and the checkpoint one.
func (d *dispatcher) flush(ctx context.Context) error {
	d.takeAhead()
	r, c, l := d.s.r, &d.ckpt, d.s.lock
	l.use.Lock()
	defer l.use.Unlock()
	if err := l.lostErr(); err != nil {
		return err
	}
	if r.hooks.beforeCheckpoint != nil && len(c.del) > 0 {
		if err := r.hooks.beforeCheckpoint(); err != nil {
			return err
		}
	}
	c.last = time.Now()
	// Not ended with ctx: a statement cancelled would close the connection, and a relay stopping
	// while it writes a checkpoint would lose its last one (a stop waits for it instead). No row
	// is published meanwhile.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	tx, err := l.conn.BeginTx(fctx, nil)
	if err != nil {
		return fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	// Failed attempts and dead letters first: a row among them published since is removed below.
	for seq, e := range c.failures {
		if _, err := tx.ExecContext(fctx, r.sql.recordFailure, e.row.Attempts, e.lastErr, timeText(e.nextAt), seq); err != nil {
			return fmt.Errorf("record a failed attempt of outbox row %d: %w", seq, err)
		}
	}
	for _, e := range c.dead {
		if _, err := tx.ExecContext(fctx, r.sql.deadLetter, e.row.Attempts, e.lastErr, timeText(e.failedAt), e.row.Seq); err != nil {
			return fmt.Errorf("dead-letter outbox row %d: %w", e.row.Seq, err)
		}
	}
	for del := c.del; len(del) > 0; {
		n := min(len(del), removeChunk)
		args := make([]any, n)
		for i, seq := range del[:n] {
			args[i] = seq
		}
		q := strings.ReplaceAll(r.sql.removePublished, "{{seqs}}", placeholders(n))
		if _, err := tx.ExecContext(fctx, q, args...); err != nil {
			return fmt.Errorf("remove published outbox rows: %w", err)
		}
		del = del[n:]
	}
	p, progress := c.pos, "file"
	if c.gtids != nil {
		p.gtid, progress = c.gtids.String(), "gtid"
	}
	if err := r.writeCheckpoint(fctx, tx, d.s.settings, progress, p, c.backfilled); err != nil {
		return err
	}
	committing := time.Now()
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)
	}
	l.held(committing)
	r.hooks.flushes.Add(1)
	r.log.Trace("Binlog relay checkpoint", r.fields.Add(watermill.LogFields{"position": p.String(), "removed": len(c.del), "dead_lettered": len(c.dead)}))
	c.del, c.dead, c.dirty, c.written.backfilled = c.del[:0], nil, false, c.backfilled
	clear(c.failures)
	return nil
}

// removeChunk is the most rows one DELETE names.
const removeChunk = 1000
