package pglog

import (
	"context"
)

// windowState is the dispatcher's window: the items read, oldest first, from the first one not
// yet behind the confirmed position.
type windowState struct {
	fifo   []*entry
	head   int
	popped int64 // items that left the window
	// doneBehind counts the entries marked done since the last compact: what it could drop.
	doneBehind int
}

func (w *windowState) len() int { return len(w.fifo) - w.head }

// add puts an item of the reader at the window's tail: a transaction's end is done at once; an
// event of a parked key is parked, and a replayed dead letter of one has check read its key back
// at its transaction's end; the session's first item reads the parked keys.
func (d *dispatcher) add(ctx context.Context, it item) error {
	if it.recovery != nil {
		d.recovered(it.recovery)
		// An item of the reader: it counts (see advance's popped).
		d.window.fifo = append(d.window.fifo, &entry{item: item{}, done: true})
		d.window.doneBehind++
		return nil
	}
	if it.start {
		if err := d.check(ctx, nil, it.drain); err != nil {
			return err
		}
		d.window.fifo = append(d.window.fifo, &entry{item: item{}, done: true})
		d.window.doneBehind++
		return nil
	}
	if it.end > 0 && len(d.park.checkKeys) > 0 {
		// The transaction that replayed dead letters of parked keys: their rows are read back
		// before its end, so the slot moves past it only once they are published (or parked again).
		keys := make([]string, 0, len(d.park.checkKeys))
		for k := range d.park.checkKeys {
			keys = append(keys, k)
		}
		clear(d.park.checkKeys)
		if err := d.check(ctx, keys, true); err != nil {
			return err
		}
	}
	e := &entry{item: it, done: it.end > 0}
	d.window.fifo = append(d.window.fifo, e)
	if e.done {
		d.window.doneBehind++
	}
	if it.bad != nil {
		e.done = true // once dead-lettered, below
		d.dead.bad = append(d.dead.bad, e)
		return nil
	}
	if it.end > 0 {
		return nil
	}
	if d.txn.pub != nil && d.txn.ready && d.skipCommitted(e) {
		return nil // before the parking: a row the broker has is neither parked nor written again
	}
	k := it.row.PartitionKey
	if from, ok := d.park.keys[k]; ok && k != "" && it.row.Seq >= from {
		if it.replayed && it.xid != 0 {
			// A replayed dead letter of a parked key: check reads it back from the table, with
			// the key's parked events behind it, at its transaction's end.
			d.park.checkKeys[k] = true
			d.park.checkXids = appendXid(d.park.checkXids, it.xid)
			e.done, e.delKey = true, ""
			d.window.doneBehind++
			return nil
		}
		d.parkEvent(e)
		return nil
	}
	if it.delKey != "" && k != "" && it.row.Seq <= d.park.drained[k] &&
		((it.replayed && d.s.r.fcfg.ParkKeyOnDeadLetter) || (!it.replayed && d.s.r.cfg.Mode == ModeWAL)) {
		// Read back by check already: a replayed dead letter whose key check found unparked
		// before its INSERT arrived (a parked key is unparked by check alone, which reads the
		// table once the replay has committed), or, in WAL mode, the relay's own parked row come
		// back through the log.
		e.done, e.delKey = true, ""
		d.window.doneBehind++
	}
	return nil
}

// advance drops the done entries at the head of the window; passing a transaction's end makes its
// position confirmable. A row of the open transaction (pending) stops it until the commit.
func (d *dispatcher) advance() {
	for d.window.head < len(d.window.fifo) && (d.window.fifo[d.window.head].done || d.window.fifo[d.window.head].barrier != nil) &&
		!d.window.fifo[d.window.head].pending {
		e := d.window.fifo[d.window.head]
		if e.end > 0 {
			d.checkpoint.confirmable = max(d.checkpoint.confirmable, e.end)
		} else if e.delKey != "" && !e.readBack {
			d.queueDelete(e)
		}
		for _, g := range e.barrier {
			if g.delKey != "" { // published: neither dead-lettered nor parked again
				d.queueDelete(g)
			}
		}
		d.window.fifo[d.window.head] = nil
		d.window.head++
		d.window.popped += 1 + e.extra
	}
	// Compaction walks the whole window. The loop turns at each outcome, so a full window is
	// compacted once a sixteenth of it is done — which keeps the walk to a few entries an outcome
	// while a backlog keeps the window full — or at once when nothing is in flight, when no outcome
	// will come to make room.
	if w := d.s.r.cfg.Window; d.window.len() >= w && d.window.doneBehind > 0 && (d.publish.inFlight == 0 || d.window.doneBehind >= w/16) {
		d.compact()
	}
	if d.window.head > 1024 && d.window.head > len(d.window.fifo)/2 {
		d.window.fifo = append(d.window.fifo[:0], d.window.fifo[d.window.head:]...)
		d.publish.scan = max(d.publish.scan-d.window.head, 0)
		d.window.head = 0
	}
}

// compact makes room in a full window whose head is held (by a pause, a backoff, a slow key): of
// each run of done entries behind the head it keeps one — the run's last transaction end, which is
// all the confirmed position needs once the head is done, or else its last entry — standing for
// the others, and queues the published rows among them for removal at once (a published row may
// leave the table before the position passes it: the rows left are still every event not yet
// published). The window then holds the events not done, so held events fill it, not the ones
// that flowed past them; once Window of them are held, the reading waits.
func (d *dispatcher) compact() {
	kept := d.window.fifo[:d.window.head]
	var run []*entry // the current run of done entries
	closeRun := func() {
		if len(run) == 0 {
			return
		}
		keep := run[len(run)-1]
		for _, e := range run {
			if e.end > 0 {
				keep = e
			}
		}
		for _, e := range run {
			if e == keep {
				continue
			}
			keep.extra += 1 + e.extra
			if e.end == 0 && e.delKey != "" && !e.readBack {
				d.queueDelete(e)
			}
		}
		kept = append(kept, keep)
		run = run[:0]
	}
	rest := append([]*entry(nil), d.window.fifo[d.window.head:]...)
	for _, e := range rest {
		if e.done && !e.pending { // a row of the open transaction stays until it commits
			run = append(run, e)
			continue
		}
		closeRun()
		kept = append(kept, e)
	}
	closeRun()
	clear(d.window.fifo[len(kept):])
	d.window.fifo = kept
	d.window.doneBehind = 0
	d.publish.scan = d.window.head
}
