package pglog

import (
	"context"
	"errors"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
)

// entry is an item in the dispatcher's window, oldest first.
type entry struct {
	item
	done   bool // published or dead-lettered; a transaction's end is always done
	nextAt time.Time
	// inFlight is a row being published: until its outcome comes back, its key's later rows wait.
	inFlight bool
	// pending is a row published in the open transaction (txn.go): done for its key's later rows,
	// which may follow it into the transaction, but neither passed by the head nor compacted until
	// the transaction commits — so no checkpoint removes it or records a position past it first.
	pending bool
	// extra counts the items compact dropped in favour of this one: it stands for 1 + extra.
	extra int64
	// readBack is a row check read back from the table: its removal waits for its check's
	// barrier. A barrier follows the rows of one check and removes those published once it
	// reaches the head — once every one of them is done — so that a key's rows leave the table
	// together: a restart in the middle finds the replayed dead letter, or the archived one,
	// still there, and reads the rest back again.
	readBack bool
	barrier  []*entry
}

// dispatcher publishes the items through the forwarder and moves the confirmed position over the
// transactions whose events are all done.
//
// There are no rounds: a row starts as soon as it may go — decoded, due, its topic and the relay
// not paused, and no earlier row of its key in flight or waiting — in a goroutine of its own
// (forwarder.SourceRelay.PublishRow), up to MaxInFlight rows at once. Since a key has at most one row in
// flight, that also bounds the keys in flight; a row without a key is a lane of its own. Each
// outcome comes back over done, and the dispatcher's goroutine alone records it, so all the
// state below is its own; a key's next row starts at the first turn of the loop after its
// previous one is confirmed. The checkpoint runs beside the publishing (see startFlush), on what
// it took from the state when it started.
//
// Its state is grouped by the concern that owns it, each in the file of its code; the loop (run)
// ties them together.
type dispatcher struct {
	s *session

	window     windowState     // the items read and not yet behind the confirmed position (window.go)
	publish    publishState    // the rows in flight and what decides the next ones (publish.go)
	checkpoint checkpointState // the removal of published rows and the position recorded with it (checkpoint.go)
	park       parkState       // keys parked behind a dead letter, with ParkKeyOnDeadLetter (park.go)
	dead       deadLetterState // dead letters waiting for the next checkpoint (dead_letters.go)
	txn        txnState        // the broker's transactions, with a transactional publisher (txn.go)
}

func newDispatcher(s *session) *dispatcher {
	d := &dispatcher{s: s}
	d.publish = publishState{done: make(chan completion, max(s.r.fcfg.MaxInFlight, 1)), busy: map[string]bool{}, busySeqs: map[int64]bool{},
		held: map[string]bool{}, paused: map[string]bool{}, seqs: map[int64]bool{}}
	d.checkpoint.last = time.Now()
	d.park = parkState{keys: map[string]int64{}, checkKeys: map[string]bool{}, drained: map[string]int64{}}
	var pub forwarder.TransactionalPublisher
	if s.fwd != nil { // nil in tests of the window alone
		pub = s.fwd.Transactions()
	}
	d.txn = newTxnState(pub)
	return d
}

// run publishes until in is closed. stop is the relay's context: once it ends, nothing new is
// published, and what was published is flushed (unless the crash hook says otherwise). It returns
// once every publish and checkpoint it started has returned.
func (d *dispatcher) run(ctx, stop context.Context) (err error) {
	r := d.s.r
	pubCtx, cancelPub := context.WithCancel(stop)
	if d.txn.pub != nil {
		// The rows in flight at the stop finish (PublishTimeout bounds each) and commit with the
		// last transaction: cut short, they would abort it, and its rows would go again.
		pubCtx, cancelPub = context.WithCancel(context.WithoutCancel(stop))
	}
	d.publish.ctx = pubCtx
	defer func() {
		cancelPub()
		if err != nil {
			close(d.s.failed)
		}
		d.settle()
		if err != nil && !errors.Is(err, errCrashed) {
			d.abortOpen(ctx) // the next session reads its rows again
		}
		if err != nil {
			for range d.s.in { // let the reader finish
			}
		}
	}()
	flushTick := time.NewTicker(r.cfg.FlushInterval)
	defer flushTick.Stop()
	open := true
	for open {
		// Take what is waiting, up to the window, and the outcomes that came back.
	fill:
		for d.window.len() < r.cfg.Window {
			select {
			case it, ok := <-d.s.in:
				if !ok {
					open = false
					break fill
				}
				if err := d.add(ctx, it); err != nil {
					return err
				}
			default:
				break fill
			}
		}
		if !open {
			break
		}
	collect:
		for d.publish.inFlight > 0 {
			select {
			case c := <-d.publish.done:
				d.complete(c)
			default:
				break collect
			}
		}
		if err := d.deadLetterBad(ctx); err != nil {
			return err
		}
		if d.txn.fenced != nil {
			return fatalError{d.txn.fenced}
		}
		if d.txnDue() {
			if err := d.checkpointTxn(ctx, stop); err != nil {
				return err
			}
		}
		now := r.fcfg.Now()
		// Taken before the pauses are read: a resume after this closes it.
		pausesChanged := d.s.fwd.PausesChanged()
		wakeAt := time.Time{}
		if stop.Err() == nil {
			if wakeAt, err = d.launch(ctx, now); err != nil {
				return err
			}
		}
		d.advance()
		if len(d.checkpoint.del) >= r.cfg.FlushRows || time.Since(d.checkpoint.last) >= r.cfg.FlushInterval {
			d.startFlush(ctx)
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
		if d.window.len() < r.cfg.Window {
			in = d.s.in
		}
		select {
		case it, ok := <-in:
			if !ok {
				open = false
				break
			}
			if err := d.add(ctx, it); err != nil {
				return err
			}
		case c := <-d.publish.done:
			d.complete(c)
		case res := <-d.checkpoint.flushing:
			d.checkpoint.flushing = nil
			if err := d.flushed(res); err != nil {
				return err
			}
		case <-wake:
		case <-pausesChanged:
		case <-flushTick.C:
			if len(d.park.keys) > 0 && stop.Err() == nil {
				// An archived dead letter unparks its key with no INSERT in the log: ask.
				keys := make([]string, 0, len(d.park.keys))
				for k := range d.park.keys {
					keys = append(keys, k)
				}
				if err := d.check(ctx, keys, true); err != nil {
					return err
				}
			}
			if d.txn.open {
				if err := d.checkpointTxn(ctx, stop); err != nil {
					return err
				}
			}
			d.startFlush(ctx)
			// Alive, and its database answers: the last pass stays current while idle or paused.
			d.s.fwd.IdlePass()
		case <-stop.Done():
			// Wait for the reader to stop; flush below.
			for it := range d.s.in {
				if err := d.add(ctx, it); err != nil {
					return err
				}
			}
			open = false
		}
		if timer != nil {
			timer.Stop()
		}
	}
	// The rows in flight (once stop has ended, each returns at once, or when its publisher does):
	// what they published is flushed below.
	for d.publish.inFlight > 0 {
		d.complete(<-d.publish.done)
	}
	if err := d.deadLetterBad(ctx); err != nil {
		return err
	}
	d.advance()
	if r.hooks.crash && stop.Err() != nil {
		return nil // as a killed process: nothing flushed, nothing confirmed, nothing committed
	}
	if err := d.endTxn(ctx, stop); err != nil {
		return err
	}
	return d.flush(ctx)
}

// settle waits for the publishes and the checkpoint in flight when run returns; their outcomes
// are dropped (the next session reads again from the confirmed position).
func (d *dispatcher) settle() {
	for ; d.publish.inFlight > 0; d.publish.inFlight-- {
		<-d.publish.done
	}
	if d.checkpoint.flushing != nil {
		<-d.checkpoint.flushing
		d.checkpoint.flushing = nil
	}
}
