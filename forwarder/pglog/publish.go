package pglog

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
)

// publishState is the publishing: the rows in flight, the broker as their outcomes showed it, and
// eligible's look for the rows that may go next.
type publishState struct {
	ctx      context.Context // the relay's context, also ended when run returns
	done     chan completion // outcomes of the rows in flight; room for MaxInFlight: a send never waits
	inFlight int
	busy     map[string]bool // keys with a row in flight
	busySeqs map[int64]bool  // rows in flight, by seq: a row read twice (backfill and log) goes once at a time
	// probing: a row came back from an unreachable broker, or from an open circuit. Until a row
	// gets through, one row at a time is in flight, which is the circuit's probe once it half-opens.
	probing    bool
	pauseUntil time.Time // the broker circuit's probe time
	// scan is where eligible starts: the entries from head to it are done, in flight or barriers.
	// It moves back to head when an entry in flight comes back not done, and with the window's
	// compaction; so a look for the rows that may go, at each turn of the loop, skips what went.
	scan int
	// eligible's scratch maps, cleared at each look.
	held, paused map[string]bool
	seqs         map[int64]bool
	// countedAt is when eligible last counted the events the pauses hold (a walk of the window),
	// which it does at most every heldCountEvery.
	countedAt time.Time
}

// launch starts the rows that may go now (see eligible), up to MaxInFlight rows in flight — one
// while probing an unreachable broker — and says when to look again for a row that backs off or
// for the circuit's probe time. With transactions, no row goes before the session's recovery,
// and the first one opens the transaction.
func (d *dispatcher) launch(ctx context.Context, now time.Time) (time.Time, error) {
	if d.txn.pub != nil && !d.txn.ready {
		return time.Time{}, nil // the recovery item wakes the loop
	}
	limit := d.s.r.fcfg.MaxInFlight
	if d.publish.probing {
		limit = 1
	}
	free := max(limit-d.publish.inFlight, 0)
	if free == 0 && (!d.s.fwd.Pausing() || time.Since(d.publish.countedAt) < heldCountEvery) {
		return time.Time{}, nil // an outcome coming back wakes the loop
	}
	batch, wakeAt := d.eligible(now, free)
	for _, e := range batch {
		if d.txn.pub != nil {
			if d.joinsOpen(e) {
				continue
			}
			if err := d.beginTxn(ctx); err != nil {
				return wakeAt, err
			}
		}
		d.start(e)
	}
	return wakeAt, nil
}

// eligible picks, in commit order, up to limit rows: each key's oldest row not done, while due,
// with no row of its key in flight; a key whose oldest row is in flight or backs off, or is of a
// paused topic, holds its later rows (of every topic, as the polling relay's claim does). A
// paused relay publishes nothing.
func (d *dispatcher) eligible(now time.Time, limit int) (batch []*entry, wakeAt time.Time) {
	r := d.s.r
	pausing := d.s.fwd.Pausing()
	if !pausing {
		r.held.Store(0)
	}
	// Counting what the pauses hold walks the window past the rows picked; the loop looks at each
	// outcome, so the count (SlotStatus's HeldEvents) is taken at most every heldCountEvery.
	count := pausing && time.Since(d.publish.countedAt) >= heldCountEvery
	if count {
		d.publish.countedAt = time.Now()
	}
	if d.s.fwd.RelayPaused() {
		if !count {
			return nil, time.Time{}
		}
		n := 0
		for _, e := range d.window.fifo[d.window.head:] {
			if !e.done && e.barrier == nil && !e.inFlight {
				n++
			}
		}
		r.held.Store(int64(n))
		return nil, time.Time{}
	}
	if now.Before(d.publish.pauseUntil) {
		return nil, d.publish.pauseUntil
	}
	held := d.publish.held     // keys behind an event that backs off, or picked now
	paused := d.publish.paused // keys behind an event of a paused topic
	seqs := d.publish.seqs     // rows picked now (a row read twice goes once at a time)
	clear(held)
	clear(paused)
	clear(seqs)
	parked, nPaused := 0, 0
	d.publish.scan = max(d.publish.scan, d.window.head)
	for d.publish.scan < len(d.window.fifo) {
		if e := d.window.fifo[d.publish.scan]; !e.done && e.barrier == nil && !e.inFlight {
			break
		}
		d.publish.scan++
	}
	for _, e := range d.window.fifo[d.publish.scan:] {
		if e.done || e.barrier != nil || e.inFlight {
			continue // an event in flight has its key in d.publish.busy
		}
		k := e.row.PartitionKey
		if pausing && (k != "" && paused[k] || d.s.fwd.Paused(e.row.Topic)) {
			nPaused++
			if k != "" {
				paused[k] = true
			}
			continue
		}
		if len(batch) >= limit {
			if !count {
				break
			}
			continue // counting what the pauses hold
		}
		if (k != "" && (held[k] || d.publish.busy[k])) || seqs[e.row.Seq] || d.publish.busySeqs[e.row.Seq] {
			continue
		}
		if e.nextAt.After(now) {
			if k != "" {
				held[k] = true
				parked++
			}
			if wakeAt.IsZero() || e.nextAt.Before(wakeAt) {
				wakeAt = e.nextAt
			}
			continue
		}
		batch = append(batch, e)
		if k != "" {
			held[k] = true // one row of a key at a time
		}
		seqs[e.row.Seq] = true
	}
	r.parked.Store(int64(parked))
	if count {
		r.held.Store(int64(nPaused))
	}
	return batch, wakeAt
}

// heldCountEvery is the most often eligible counts the events the pauses hold.
const heldCountEvery = 100 * time.Millisecond

// completion is a row's outcome, handed back to the dispatcher's loop.
type completion struct {
	e   *entry
	del forwarder.Delivery
}

// start publishes e in a goroutine of its own; its outcome comes back over done.
func (d *dispatcher) start(e *entry) {
	e.inFlight = true
	d.publish.inFlight++
	if k := e.row.PartitionKey; k != "" {
		d.publish.busy[k] = true
	}
	d.publish.busySeqs[e.row.Seq] = true
	row, fwd, ctx, done := e.row, d.s.fwd, d.publish.ctx, d.publish.done
	go func() { done <- completion{e: e, del: fwd.PublishRow(ctx, row)} }()
}

// complete records a row's outcome: published, failed (it backs off, its key's later rows behind
// it, or is dead-lettered), or released untouched (a paused topic, the broker unreachable or its
// circuit open, or stop ended): it goes again when it may.
func (d *dispatcher) complete(c completion) {
	e, del := c.e, c.del
	d.publish.inFlight--
	e.inFlight = false
	if k := e.row.PartitionKey; k != "" {
		delete(d.publish.busy, k)
	}
	delete(d.publish.busySeqs, e.row.Seq)
	if len(del.Published) > 0 || len(del.Failed) > 0 {
		d.publish.probing = false // the broker answered: the circuit is closed
	}
	if del.UnreachableErr != nil || del.CircuitOpen {
		d.publish.probing = true
	}
	if del.CircuitOpen {
		d.publish.pauseUntil = del.RetryAt
	}
	if del.Fenced != nil {
		d.txn.fenced = del.Fenced // the loop stops
		return
	}
	if len(del.Published) > 0 {
		e.done = true
		d.window.doneBehind++
		if d.txn.pub != nil {
			// Kept whole until the transaction commits: an abort sends it again.
			e.pending = true
			d.txn.rows = append(d.txn.rows, e)
			d.txn.seqs[e.row.Seq] = true
			return
		}
		e.row.Payload, e.row.Metadata = nil, nil
		return
	}
	if d.txn.pub != nil && !del.CircuitOpen {
		// Sent and not confirmed: it may be in the transaction all the same (see txn.go).
		d.txn.poisoned = true
	}
	d.publish.scan = d.window.head // e is behind it, and not done unless dead-lettered
	for _, f := range del.Failed {
		e.row.Attempts++
		if f.DeadLettered {
			d.deadLetter(e, f.Error)
			e.done = true
			d.window.doneBehind++
			e.delKey = "" // kept in the outbox as a dead letter
			e.row.Payload, e.row.Metadata = nil, nil
			if d.s.r.fcfg.ParkKeyOnDeadLetter && e.row.PartitionKey != "" {
				d.parkKey(e.row.PartitionKey, e.row.Seq)
			}
			continue
		}
		e.nextAt = f.NextAttemptAt
	}
}
