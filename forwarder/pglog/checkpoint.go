package pglog

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/store"
)

// checkpointState is the checkpoint: the published rows to remove and the position to record
// with them, and the checkpoint running beside the publishing, if any.
type checkpointState struct {
	flushing    chan checkpointDone // the running checkpoint's outcome comes back here; nil when none runs
	confirmable pglogrepl.LSN       // the end of the last transaction left entirely behind
	flushedLSN  pglogrepl.LSN       // the position the last checkpoint recorded
	del         []string            // published rows' uuids, removed at the next flush
	xids        []uint32            // their writers' transaction ids (0s left out), see runFlush
	tableSeqs   []int64             // with transactions, the seqs of those read from the table (txnFlushed)
	last        time.Time           // when the last checkpoint was taken
}

// flush removes the published rows and records the confirmable position in one statement, then
// lets the reader confirm it to the server: what the server is told is published is gone from
// the table, so the rows left there are what a lost slot's backfill must read. It waits for the
// checkpoint running beside the loop first, and runs in the loop: check and the last flush need
// the table written before they go on.
func (d *dispatcher) flush(ctx context.Context) error {
	if err := d.awaitFlush(); err != nil {
		return err
	}
	j := d.takeFlush()
	if j == nil {
		return nil
	}
	return d.flushed(d.runFlush(ctx, j))
}

// startFlush starts a checkpoint beside the loop, unless one runs already: the loop goes on
// publishing meanwhile, and records its outcome when it comes back (flushed). What it removes and
// the position it records are taken now: rows published meanwhile go with the next one. The
// position it confirms is below every row it removes or that was removed before (advance queues
// a row's removal before the position passes it), so the server is still never told of a
// position whose rows are left in the table.
func (d *dispatcher) startFlush(ctx context.Context) {
	if d.checkpoint.flushing != nil {
		return
	}
	j := d.takeFlush()
	if j == nil {
		return
	}
	ch := make(chan checkpointDone, 1)
	d.checkpoint.flushing = ch
	go func() { ch <- d.runFlush(ctx, j) }()
}

// awaitFlush waits for the checkpoint running beside the loop, if any, and records it.
func (d *dispatcher) awaitFlush() error {
	if d.checkpoint.flushing == nil {
		return nil
	}
	res := <-d.checkpoint.flushing
	d.checkpoint.flushing = nil
	return d.flushed(res)
}

// flushJob is one checkpoint's work, taken from the dispatcher's state when it starts.
type flushJob struct {
	del         []string // published rows' uuids
	xids        []uint32 // their writers' transaction ids (0s left out)
	tableSeqs   []int64  // with transactions, the seqs of those read from the table
	hide        bool     // the hideRows hook: remove none
	dead        []deadRow
	park        []store.OutboxRow
	parkFrom    map[string]int64 // keys parked from a dead letter of the log among dead: its seq in the log
	confirmable pglogrepl.LSN
	popped      int64
}

// checkpointDone is a checkpoint's outcome: parkedAt, in WAL mode, the seq of the rows written for
// the dead letters that park their keys.
type checkpointDone struct {
	job      *flushJob
	parkedAt map[string]int64
	err      error
}

// takeFlush takes the pending work of a checkpoint, or, with nothing to remove, write or record,
// returns nil after counting the items done as flushed.
func (d *dispatcher) takeFlush() *flushJob {
	d.checkpoint.last = time.Now()
	if len(d.checkpoint.del) == 0 && len(d.dead.pending) == 0 && len(d.park.rows) == 0 && d.checkpoint.confirmable == d.checkpoint.flushedLSN {
		d.s.flushed.Store(d.window.popped)
		return nil
	}
	r := d.s.r
	j := &flushJob{del: d.checkpoint.del, xids: d.checkpoint.xids, tableSeqs: d.checkpoint.tableSeqs, dead: d.dead.pending, park: d.park.rows,
		confirmable: d.checkpoint.confirmable, popped: d.window.popped}
	if r.hooks.hideRows > 0 && len(j.del) > 0 {
		r.hooks.hideRows--
		j.hide = true // as a snapshot that does not see them yet
	}
	for _, dl := range d.dead.pending {
		k := dl.row.PartitionKey
		if from, ok := d.park.keys[k]; ok && k != "" && dl.delKey == "" && from == dl.row.Seq {
			if j.parkFrom == nil {
				j.parkFrom = map[string]int64{}
			}
			j.parkFrom[k] = from
		}
	}
	d.checkpoint.del, d.checkpoint.xids, d.checkpoint.tableSeqs, d.dead.pending, d.park.rows = nil, nil, nil, nil, nil
	return j
}

// flushed records a checkpoint that came back: the position it recorded is confirmed to the server.
func (d *dispatcher) flushed(res checkpointDone) error {
	if res.err != nil {
		return res.err
	}
	j := res.job
	for k, seq := range res.parkedAt {
		if from, ok := d.park.keys[k]; ok && from == j.parkFrom[k] {
			d.park.keys[k] = seq // the key waits from the dead letter's row now, not from its place in the log
		}
	}
	if d.txn.pub != nil {
		d.txnFlushed(j)
	}
	d.checkpoint.flushedLSN = j.confirmable
	d.s.ack.Store(uint64(j.confirmable))
	d.s.flushed.Store(j.popped)
	r := d.s.r
	r.log.Trace("Log relay flushed", r.fields.Add(watermill.LogFields{"confirmed": j.confirmable.String()}))
	return nil
}

// runFlush runs j: it reads nothing of the dispatcher's state, so it may run beside the loop.
func (d *dispatcher) runFlush(ctx context.Context, j *flushJob) checkpointDone {
	r := d.s.r
	if r.hooks.beforeConfirm != nil {
		if err := r.hooks.beforeConfirm(); err != nil {
			return checkpointDone{job: j, err: fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)}
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	checkpoint := r.sql.Checkpoint
	del := j.del
	if j.hide {
		del = nil
	}
	args := []any{del, r.fcfg.Name, r.cfg.SlotName, string(r.cfg.Mode), j.confirmable.String()}
	var removed int
	var err error
	var parkedAt map[string]int64 // WAL mode: the rows written for dead letters that park their keys
	if len(j.dead) == 0 && len(j.park) == 0 {
		err = r.cfg.Pool.QueryRow(fctx, checkpoint, args...).Scan(&removed)
	} else {
		// A dead letter is an UPDATE of its row, which must see it (see below).
		var xids []uint32
		for _, dl := range j.dead {
			if dl.delKey != "" && dl.xid != 0 {
				xids = append(xids, dl.xid)
			}
		}
		if err := d.waitVisible(fctx, xids); err != nil {
			return checkpointDone{err: err}
		}
		// The dead letters, the parked events of the log after them (so in seq order behind
		// them), and the checkpoint that moves past them, in one transaction.
		parkedAt = map[string]int64{}
		err = pgx.BeginFunc(fctx, r.cfg.Pool, func(tx pgx.Tx) error {
			clear(parkedAt)
			for _, dl := range j.dead {
				if err := d.writeDeadLetter(fctx, tx, dl); err != nil {
					return err
				}
				k := dl.row.PartitionKey
				if from, ok := j.parkFrom[k]; ok && dl.delKey == "" && from == dl.row.Seq {
					// The key waits from the dead letter's row now, not from its place in the log.
					var seq int64
					key, _ := pgsql.StoredID(dl.row.UUID)
					if err := tx.QueryRow(fctx, r.sql.DeadLetterSeq, key).Scan(&seq); err != nil {
						return fmt.Errorf("read dead letter %s back: %w", dl.row.UUID, err)
					}
					parkedAt[k] = seq
				}
			}
			for _, row := range j.park {
				if err := d.writeParked(fctx, tx, row); err != nil {
					return err
				}
			}
			return tx.QueryRow(fctx, checkpoint, args...).Scan(&removed)
		})
	}
	if err != nil {
		return checkpointDone{err: fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)}
	}
	if removed < len(j.del) {
		// Fewer rows removed than published. The server sends a transaction once its commit record
		// is flushed, a moment before the commit is visible to other sessions: a DELETE in that
		// moment misses the row, which would stay in the table forever once the position passes
		// it. (A row read twice, or removed by an earlier session that died before confirming,
		// also counts short; removing again is harmless.) Wait until every writer's commit is
		// visible, then remove again; only then is the server told.
		if err := d.waitVisible(fctx, j.xids); err != nil {
			return checkpointDone{err: err}
		}
		_, err := r.cfg.Pool.Exec(fctx, r.sql.RemovePublished, j.del)
		if err != nil {
			return checkpointDone{err: fmt.Errorf("remove published outbox rows: %w", err)}
		}
	}
	return checkpointDone{job: j, parkedAt: parkedAt}
}

// queueDelete queues a published row's removal at the next flush.
func (d *dispatcher) queueDelete(e *entry) {
	d.checkpoint.del = append(d.checkpoint.del, e.delKey)
	if d.txn.pub != nil && e.commit == 0 {
		d.checkpoint.tableSeqs = append(d.checkpoint.tableSeqs, e.row.Seq)
	}
	if e.xid != 0 && (len(d.checkpoint.xids) == 0 || d.checkpoint.xids[len(d.checkpoint.xids)-1] != e.xid) {
		d.checkpoint.xids = append(d.checkpoint.xids, e.xid)
	}
}
