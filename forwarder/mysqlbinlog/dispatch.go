package mysqlbinlog

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// entry is an item in the dispatcher's window, oldest first.
type entry struct {
	item
	// done: published, or dead-lettered; a transaction's end, and the table's, are done at once.
	done bool
	dead bool // dead-lettered: recorded by the checkpoint that passes it
	// removed is a published row removed from the table ahead of the checkpoint's position
	// (see takeAhead).
	removed bool
	// The last failure: its error, when it happened (a dead letter's time) and, backing off,
	// when the row is tried again (item.nextAt).
	lastErr  string
	failedAt time.Time
}

// dispatcher publishes the reader's items in rounds through the forwarder and moves the
// checkpoint over the transactions whose rows are all done. Its goroutine alone touches its state.
//
// A round hands PublishRows, in commit order, the rows of the window that may go: not done, due,
// not of a paused topic, and no earlier row of their key waiting (backing off, paused) — at most
// the forwarder's BatchSize. The forwarder publishes each key's rows in the order given and
// stops a key at its first failure, MaxInFlight keys at once; so a key's rows reach the broker in
// commit order, and a key that backs off holds only its own rows.
type dispatcher struct {
	s     *session
	fifo  []*entry
	head  int
	ckpt  checkpointState
	retry time.Time // no round before: the circuit's probe time, or a round that got nowhere
	// rounds counts the rounds since the last tick: none, and the tick reports an idle pass.
	rounds int
}

// idleRound is how long the dispatcher waits after a round that neither published nor failed a
// row, nor found the circuit open (its rows released by a pause read meanwhile, say), before
// the next: no round is repeated at once to the same end.
const idleRound = 100 * time.Millisecond

func newDispatcher(s *session) (*dispatcher, error) {
	d := &dispatcher{s: s}
	d.ckpt.pos = s.from
	d.ckpt.backfilled, d.ckpt.written.backfilled = s.backfilled, s.backfilled
	d.ckpt.failures = map[int64]*entry{}
	d.ckpt.last = time.Now()
	if s.gtid {
		g, err := newGTIDPosition(s.settings.flavor, s.from.gtid)
		if err != nil {
			return nil, fatal("the checkpoint's %w", err)
		}
		d.ckpt.gtids = g
	}
	return d, nil
}

func (d *dispatcher) len() int { return len(d.fifo) - d.head }

// run publishes until ctx ends or the reader stops, then writes a last checkpoint of what is done.
func (d *dispatcher) run(ctx context.Context) error {
	r, sr := d.s.r, d.s.fwd
	tick := time.NewTicker(r.cfg.FlushInterval)
	defer tick.Stop()
	stopped := false // the reader closed its channel
	for !stopped && ctx.Err() == nil {
	fill:
		for d.len() < r.cfg.Window {
			select {
			case it, ok := <-d.s.in:
				if !ok {
					stopped = true
					break fill
				}
				d.add(it)
			default:
				break fill
			}
		}
		if stopped {
			break
		}
		now := r.fcfg.Now()
		// Taken before the pauses are read: a resume after this closes it.
		pausesChanged := sr.PausesChanged()
		batch, wakeAt := d.eligible(now)
		if len(batch) > 0 {
			// No round unless the lock is known held: the server may give it to another relay
			// once it has not heard from this one for the lease.
			if err := d.s.lock.fresh(); err != nil {
				return err
			}
			d.publish(ctx, batch, now)
			d.advance()
			if d.flushDue() {
				if err := d.flush(ctx); err != nil {
					return err
				}
			}
			continue
		}
		d.advance()
		if d.flushDue() {
			if err := d.flush(ctx); err != nil {
				return err
			}
		}
		var (
			wake  <-chan time.Time
			timer *time.Timer
		)
		if !wakeAt.IsZero() {
			timer = time.NewTimer(max(wakeAt.Sub(now), time.Millisecond))
			wake = timer.C
		}
		var in <-chan item
		if d.len() < r.cfg.Window {
			in = d.s.in
		}
		select {
		case it, ok := <-in:
			if ok {
				d.add(it)
			} else {
				stopped = true
			}
		case <-wake:
		case <-pausesChanged:
		case <-tick.C:
			if d.rounds == 0 {
				// Alive, and its database answers: the last pass stays current while idle or paused.
				sr.IdlePass()
			}
			d.rounds = 0
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
	}
	if !stopped {
		// ctx ended: the reader stops at a transaction's end, and what it handed over is taken in,
		// so that the last checkpoint passes the transactions whose rows were published.
		for it := range d.s.in {
			d.add(it)
		}
	}
	d.advance()
	if r.hooks.crash && ctx.Err() != nil {
		return nil // as a killed process: no last checkpoint
	}
	// The last checkpoint, also when ctx ended: what was published is not published again.
	if err := d.flush(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if stopped && ctx.Err() == nil {
		return errReaderStopped
	}
	return nil
}

// add puts an item of the reader at the window's tail.
func (d *dispatcher) add(it item) {
	d.fifo = append(d.fifo, &entry{item: it, done: it.end || it.tableDone})
}

// eligible picks, in commit order, the rows that may go now, up to BatchSize, and says when to
// look again for a row that backs off or for the circuit's probe time.
func (d *dispatcher) eligible(now time.Time) (batch []*entry, wakeAt time.Time) {
	sr := d.s.fwd
	if sr.RelayPaused() {
		return nil, time.Time{} // a resume closes PausesChanged
	}
	if now.Before(d.retry) {
		return nil, d.retry
	}
	limit := max(d.s.r.fcfg.BatchSize, 1)
	held := map[string]bool{} // keys behind a row that waits
	seqs := map[int64]bool{}  // rows picked (a row read twice, from the table and the log, goes once at a time)
	for _, e := range d.fifo[d.head:] {
		if e.done {
			continue
		}
		k := e.row.PartitionKey
		if k != "" && held[k] {
			continue
		}
		wait := seqs[e.row.Seq] || sr.Paused(e.row.Topic)
		if !wait && e.nextAt.After(now) {
			wait = true
			if wakeAt.IsZero() || e.nextAt.Before(wakeAt) {
				wakeAt = e.nextAt
			}
		}
		if wait {
			if k != "" {
				held[k] = true
			}
			continue
		}
		batch = append(batch, e)
		seqs[e.row.Seq] = true
		if len(batch) >= limit {
			break
		}
	}
	return batch, wakeAt
}

// publish runs one round and records what it did to each row.
func (d *dispatcher) publish(ctx context.Context, batch []*entry, now time.Time) {
	d.rounds++
	rows := make([]store.OutboxRow, len(batch))
	bySeq := make(map[int64]*entry, len(batch))
	for i, e := range batch {
		rows[i] = e.row
		bySeq[e.row.Seq] = e
	}
	del := d.s.fwd.PublishRows(ctx, rows)
	for _, seq := range del.Published {
		e := bySeq[seq]
		e.done = true
		e.row.Payload, e.row.Metadata = nil, nil
		delete(d.ckpt.failures, seq)
	}
	for _, f := range del.Failed {
		e := bySeq[f.Seq]
		e.row.Attempts++
		e.lastErr, e.failedAt = f.Error, now
		if f.DeadLettered {
			e.done, e.dead = true, true
			e.row.Payload, e.row.Metadata = nil, nil
			delete(d.ckpt.failures, f.Seq)
			continue
		}
		e.nextAt = f.NextAttemptAt
		d.ckpt.failures[f.Seq] = e
	}
	switch {
	case del.CircuitOpen:
		d.retry = del.RetryAt
	case len(del.Published) == 0 && len(del.Failed) == 0 && del.UnreachableErr == nil:
		d.retry = now.Add(idleRound)
	}
}

// flushDue reports whether a checkpoint is to be written now.
func (d *dispatcher) flushDue() bool {
	now := time.Now()
	if now.Sub(d.ckpt.last) >= d.s.r.cfg.FlushInterval {
		d.takeAhead()
	}
	return d.ckpt.due(d.s.r.cfg, now)
}

// takeAhead queues for removal, when the window's head waits (backing off, paused), the rows
// published behind it: the checkpoint's position cannot pass the head, and those rows would
// otherwise stay in the table, counted as pending by the console and the stats, for as long as
// the head waits. A relay starting again from the checkpoint publishes them again (they follow
// its position in the log): a duplicate, as for every row published after the position. Dead
// letters wait for the position to pass them: the log, read again, would bring the row back.
func (d *dispatcher) takeAhead() {
	if d.head >= len(d.fifo) {
		return
	}
	// Only a head that waits: one merely not yet published goes with the next round, and the
	// position passes its followers then.
	h, sr := d.fifo[d.head], d.s.fwd
	waits := h.nextAt.After(d.s.r.fcfg.Now()) || sr.RelayPaused() || sr.Paused(h.row.Topic)
	if h.done || !waits {
		return
	}
	for _, e := range d.fifo[d.head+1:] {
		if e.done && !e.dead && !e.end && !e.tableDone && !e.removed {
			e.removed = true
			d.ckpt.del = append(d.ckpt.del, e.row.Seq)
		}
	}
}

// advance drops the done entries at the head of the window: a transaction's end moves the
// checkpoint's position over it, and hands its published rows and dead letters to the next
// checkpoint.
func (d *dispatcher) advance() {
	c := &d.ckpt
	for d.head < len(d.fifo) && d.fifo[d.head].done {
		e := d.fifo[d.head]
		switch {
		case e.end:
			if c.gtids != nil && e.gtid != "" {
				if err := c.gtids.add(e.gtid); err != nil {
					// A GTID the server wrote that does not parse: the position stays where
					// it was, and the next one moves it.
					d.s.r.log.Error("Binlog relay read a GTID it cannot parse", err, d.s.r.fields)
				}
			}
			c.pos.file, c.pos.pos = e.file, e.pos
			c.del, c.dead = append(c.del, c.txnDel...), append(c.dead, c.txnDead...)
			c.txnDel, c.txnDead = c.txnDel[:0], c.txnDead[:0]
			if !e.quiet {
				c.dirty = true
			}
		case e.tableDone:
			c.backfilled = true
		case e.dead && e.fromTable:
			c.dead = append(c.dead, e)
		case e.dead:
			c.txnDead = append(c.txnDead, e)
		case e.removed:
		case e.fromTable:
			c.del = append(c.del, e.row.Seq)
		default:
			c.txnDel = append(c.txnDel, e.row.Seq)
		}
		d.fifo[d.head] = nil
		d.head++
	}
	if d.head > 1024 && d.head > len(d.fifo)/2 {
		d.fifo = append(d.fifo[:0], d.fifo[d.head:]...)
		d.head = 0
	}
}
