package pglog

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/store"
)

// entry is an item in the dispatcher's window, oldest first.
type entry struct {
	item
	done   bool // published or dead-lettered; a transaction's end is always done
	nextAt time.Time
	// inFlight is a row being published: until its outcome comes back, its key's later rows wait.
	inFlight bool
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
// (forwarder.PublishRow), up to MaxInFlight rows at once. Since a key has at most one row in
// flight, that also bounds the keys in flight; a row without a key is a lane of its own. Each
// outcome comes back over done, and the dispatcher's goroutine alone records it, so all the
// state below is its own; a key's next row starts at the first turn of the loop after its
// previous one is confirmed. The checkpoint runs beside the publishing (see startFlush).
type dispatcher struct {
	s      *session
	fifo   []*entry
	head   int
	popped int64 // items that left the window

	// Publishing.
	pubCtx   context.Context // the relay's context, also ended when run returns
	done     chan completion // outcomes of the rows in flight; room for MaxInFlight: a send never waits
	inFlight int
	busy     map[string]bool // keys with a row in flight
	busySeqs map[int64]bool  // rows in flight, by seq: a row read twice (backfill and log) goes once at a time
	// probing: a row came back from an unreachable broker, or from an open circuit. Until a row
	// gets through, one row at a time is in flight, which is the circuit's probe once it half-opens.
	probing bool
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

	// The checkpoint running beside the publishing, if any: its outcome comes back here.
	flushing chan checkpointDone

	confirmable pglogrepl.LSN // the end of the last transaction left entirely behind
	flushedLSN  pglogrepl.LSN
	pendingDel  []string // published rows' uuids, removed at the next flush
	pendingXids []uint32 // their writers' transaction ids (0s left out), see flush
	lastFlush   time.Time
	pauseUntil  time.Time // the broker circuit's probe time
	bad         []*entry  // messages that do not decode, to dead-letter
	pendingDead []deadRow // dead letters, written with the next checkpoint
	doneBehind  int       // entries marked done since the last compact: what it could drop

	// With ParkKeyOnDeadLetter: the keys parked behind a dead letter, each with the seq from which
	// its events wait (the dead letter's). A parked event is left in the outbox table — in WAL
	// mode written there (pendingPark), with the next checkpoint — and the slot moves past it; a
	// replay or an archive of the dead letter reads the key's rows back from the table (check).
	parked      map[string]int64
	pendingPark []store.OutboxRow // WAL mode: parked events of the log, written as outbox rows at the next flush
	parkXids    []uint32          // writers of the parked rows read from the log, for check's wait
	checkKeys   map[string]bool   // parked keys whose replayed dead letter the current transaction carries
	checkXids   []uint32
	// Per key, the highest seq read back from the table: a replayed dead letter at or below it
	// whose INSERT arrives after check unparked its key, and in WAL mode the relay's own parked
	// row come back through the log, were published already.
	drained map[string]int64
}

func newDispatcher(s *session) *dispatcher {
	return &dispatcher{s: s, lastFlush: time.Now(), parked: map[string]int64{}, checkKeys: map[string]bool{}, drained: map[string]int64{},
		done: make(chan completion, max(s.r.fcfg.MaxInFlight, 1)), busy: map[string]bool{}, busySeqs: map[int64]bool{},
		held: map[string]bool{}, paused: map[string]bool{}, seqs: map[int64]bool{}}
}

func (d *dispatcher) window() int { return len(d.fifo) - d.head }

func (d *dispatcher) add(ctx context.Context, it item) error {
	if it.start {
		if err := d.check(ctx, nil, it.drain); err != nil {
			return err
		}
		d.fifo = append(d.fifo, &entry{item: item{}, done: true})
		d.doneBehind++
		return nil
	}
	if it.end > 0 && len(d.checkKeys) > 0 {
		// The transaction that replayed dead letters of parked keys: their rows are read back
		// before its end, so the slot moves past it only once they are published (or parked again).
		keys := make([]string, 0, len(d.checkKeys))
		for k := range d.checkKeys {
			keys = append(keys, k)
		}
		clear(d.checkKeys)
		if err := d.check(ctx, keys, true); err != nil {
			return err
		}
	}
	e := &entry{item: it, done: it.end > 0}
	d.fifo = append(d.fifo, e)
	if e.done {
		d.doneBehind++
	}
	if it.bad != nil {
		e.done = true // once dead-lettered, below
		d.bad = append(d.bad, e)
		return nil
	}
	if it.end > 0 {
		return nil
	}
	k := it.row.PartitionKey
	if from, ok := d.parked[k]; ok && k != "" && it.row.Seq >= from {
		if it.replayed && it.xid != 0 {
			// A replayed dead letter of a parked key: check reads it back from the table, with
			// the key's parked events behind it, at its transaction's end.
			d.checkKeys[k] = true
			d.checkXids = appendXid(d.checkXids, it.xid)
			e.done, e.delKey = true, ""
			d.doneBehind++
			return nil
		}
		d.park(e)
		return nil
	}
	if it.delKey != "" && k != "" && it.row.Seq <= d.drained[k] &&
		((it.replayed && d.s.r.fcfg.ParkKeyOnDeadLetter) || (!it.replayed && d.s.r.cfg.Mode == ModeWAL)) {
		// Read back by check already: a replayed dead letter whose key check found unparked
		// before its INSERT arrived (a parked key is unparked by check alone, which reads the
		// table once the replay has committed), or, in WAL mode, the relay's own parked row come
		// back through the log.
		e.done, e.delKey = true, ""
		d.doneBehind++
	}
	return nil
}

// park leaves e, an event of a parked key, unpublished for good in this session: a row of the
// outbox stays there; an event of the log is written there with the next checkpoint.
func (d *dispatcher) park(e *entry) {
	e.done = true
	d.doneBehind++
	if e.delKey != "" {
		e.delKey = ""
		d.parkXids = appendXid(d.parkXids, e.xid)
	} else {
		d.pendingPark = append(d.pendingPark, e.row)
	}
	e.row.Payload, e.row.Metadata = nil, nil
}

func appendXid(xids []uint32, xid uint32) []uint32 {
	if xid == 0 || (len(xids) > 0 && xids[len(xids)-1] == xid) {
		return xids
	}
	return append(xids, xid)
}

// parkKey parks key behind its dead letter at seq: its later events in the window wait.
func (d *dispatcher) parkKey(key string, seq int64) {
	if from, ok := d.parked[key]; ok && from <= seq {
		return
	}
	d.parked[key] = seq
	for _, e := range d.fifo[d.head:] {
		if !e.done && e.end == 0 && e.bad == nil && e.row.PartitionKey == key && e.row.Seq > seq {
			d.park(e)
		}
	}
}

// check reads from the table which of keys (nil: every key with an unpublished dead letter,
// archived or not, or with a replayed one) are parked, behind which seq — as the polling relay's claim does, behind the
// earliest dead letter not archived — and, with drain, appends to the window the key's rows in
// the table that may go: every row before its dead letter, or all of them once no dead letter
// parks it — from where the key was parked, for a key parked in this session. The key's parked
// events written there meanwhile are read back in seq order, so a replayed dead letter goes first
// and its key's events follow it.
func (d *dispatcher) check(ctx context.Context, keys []string, drain bool) error {
	r := d.s.r
	defer r.hooks.checks.Add(1)
	// The table as the checkpoint running beside the loop leaves it: its dead letters and parked
	// events written.
	if err := d.awaitFlush(); err != nil {
		return err
	}
	if len(d.pendingPark) > 0 || len(d.pendingDead) > 0 {
		// The events parked since the last flush, and the dead letters, into the table first.
		if err := d.flush(ctx); err != nil {
			return err
		}
	}
	if err := d.waitVisible(ctx, append(d.checkXids, d.parkXids...)); err != nil {
		return err
	}
	d.checkXids, d.parkXids = nil, nil
	park := r.fcfg.ParkKeyOnDeadLetter
	if !park && keys != nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tx, err := r.cfg.Pool.BeginTx(cctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("read the parked keys: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	// A key with a dead letter, or with a replayed one not yet published (its rows may have been
	// read back by a session that stopped before they all went).
	rows, err := tx.Query(cctx, r.sql.ParkedKeys, keys)
	if err != nil {
		return fmt.Errorf("read the parked keys: %w", err)
	}
	all := keys == nil
	from := map[string]int64{}
	for rows.Next() {
		var k string
		var seq int64
		if err := rows.Scan(&k, &seq); err != nil {
			rows.Close()
			return fmt.Errorf("read the parked keys: %w", err)
		}
		from[k] = seq
		if all {
			keys = append(keys, k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the parked keys: %w", err)
	}
	// A key parked in this session has its rows from where it was parked in the table; the rows
	// before were read as usual (some maybe published and not yet removed: not read again). A
	// session's first check reads every row of the keys, before any event.
	lo := map[string]int64{}
	for _, k := range keys {
		if all {
			lo[k] = 0
		} else if seq, ok := d.parked[k]; ok {
			lo[k] = seq
		} else {
			lo[k] = math.MaxInt64
		}
		if seq := from[k]; park && seq > 0 {
			d.parked[k] = seq
		} else {
			delete(d.parked, k)
		}
	}
	if !drain || len(keys) == 0 {
		return tx.Commit(cctx)
	}
	rows, err = tx.Query(cctx, r.sql.ReadBack, keys)
	if err != nil {
		return fmt.Errorf("read back the rows of unparked keys: %w", err)
	}
	var group []*entry
	for rows.Next() {
		it, err := scanRow(rows)
		if err != nil {
			rows.Close()
			return fmt.Errorf("read back the rows of unparked keys: %w", err)
		}
		k := it.row.PartitionKey
		if seq, ok := d.parked[k]; (ok && it.row.Seq >= seq) || it.row.Seq < lo[k] {
			continue // still parked, or not parked
		}
		d.drained[k] = max(d.drained[k], it.row.Seq)
		// Not an item of the reader: it counts for none (see advance's popped).
		e := &entry{item: it, extra: -1, readBack: true}
		d.fifo = append(d.fifo, e)
		group = append(group, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read back the rows of unparked keys: %w", err)
	}
	if n := len(group); n > 0 {
		d.fifo = append(d.fifo, &entry{extra: -1, barrier: group})
		r.log.Info("Log relay read back the events of keys no longer parked behind a dead letter", r.fields.Add(watermill.LogFields{"events": n}))
	}
	return tx.Commit(cctx)
}

// run publishes until in is closed. stop is the relay's context: once it ends, nothing new is
// published, and what was published is flushed (unless the crash hook says otherwise). It returns
// once every publish and checkpoint it started has returned.
func (d *dispatcher) run(ctx, stop context.Context) (err error) {
	r := d.s.r
	pubCtx, cancelPub := context.WithCancel(stop)
	d.pubCtx = pubCtx
	defer func() {
		cancelPub()
		if err != nil {
			close(d.s.failed)
		}
		d.settle()
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
		for d.window() < r.cfg.Window {
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
		for d.inFlight > 0 {
			select {
			case c := <-d.done:
				d.complete(c)
			default:
				break collect
			}
		}
		if err := d.deadLetterBad(ctx); err != nil {
			return err
		}
		now := r.fcfg.Now()
		// Taken before the pauses are read: a resume after this closes it.
		pausesChanged := r.fwd.PausesChanged()
		wakeAt := time.Time{}
		if stop.Err() == nil {
			wakeAt = d.launch(now)
		}
		d.advance()
		if len(d.pendingDel) >= r.cfg.FlushRows || time.Since(d.lastFlush) >= r.cfg.FlushInterval {
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
		if d.window() < r.cfg.Window {
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
		case c := <-d.done:
			d.complete(c)
		case res := <-d.flushing:
			d.flushing = nil
			if err := d.flushed(res); err != nil {
				return err
			}
		case <-wake:
		case <-pausesChanged:
		case <-flushTick.C:
			if len(d.parked) > 0 && stop.Err() == nil {
				// An archived dead letter unparks its key with no INSERT in the log: ask.
				keys := make([]string, 0, len(d.parked))
				for k := range d.parked {
					keys = append(keys, k)
				}
				if err := d.check(ctx, keys, true); err != nil {
					return err
				}
			}
			d.startFlush(ctx)
			// Alive, and its database answers: the last pass stays current while idle or paused.
			r.fwd.IdlePass()
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
	for d.inFlight > 0 {
		d.complete(<-d.done)
	}
	if err := d.deadLetterBad(ctx); err != nil {
		return err
	}
	d.advance()
	if r.hooks.crash && stop.Err() != nil {
		return nil // as a killed process: nothing flushed, nothing confirmed
	}
	return d.flush(ctx)
}

// settle waits for the publishes and the checkpoint in flight when run returns; their outcomes
// are dropped (the next session reads again from the confirmed position).
func (d *dispatcher) settle() {
	for ; d.inFlight > 0; d.inFlight-- {
		<-d.done
	}
	if d.flushing != nil {
		<-d.flushing
		d.flushing = nil
	}
}

// launch starts the rows that may go now (see eligible), up to MaxInFlight rows in flight — one
// while probing an unreachable broker — and says when to look again for a row that backs off or
// for the circuit's probe time.
func (d *dispatcher) launch(now time.Time) time.Time {
	limit := d.s.r.fcfg.MaxInFlight
	if d.probing {
		limit = 1
	}
	free := max(limit-d.inFlight, 0)
	if free == 0 && (!d.s.r.fwd.Pausing() || time.Since(d.countedAt) < heldCountEvery) {
		return time.Time{} // an outcome coming back wakes the loop
	}
	batch, wakeAt := d.eligible(now, free)
	for _, e := range batch {
		d.start(e)
	}
	return wakeAt
}

// eligible picks, in commit order, up to limit rows: each key's oldest row not done, while due,
// with no row of its key in flight; a key whose oldest row is in flight or backs off, or is of a
// paused topic, holds its later rows (of every topic, as the polling relay's claim does). A
// paused relay publishes nothing.
func (d *dispatcher) eligible(now time.Time, limit int) (batch []*entry, wakeAt time.Time) {
	r := d.s.r
	pausing := r.fwd.Pausing()
	if !pausing {
		r.held.Store(0)
	}
	// Counting what the pauses hold walks the window past the rows picked; the loop looks at each
	// outcome, so the count (SlotStatus's HeldEvents) is taken at most every heldCountEvery.
	count := pausing && time.Since(d.countedAt) >= heldCountEvery
	if count {
		d.countedAt = time.Now()
	}
	if r.fwd.RelayPaused() {
		if !count {
			return nil, time.Time{}
		}
		n := 0
		for _, e := range d.fifo[d.head:] {
			if !e.done && e.barrier == nil && !e.inFlight {
				n++
			}
		}
		r.held.Store(int64(n))
		return nil, time.Time{}
	}
	if now.Before(d.pauseUntil) {
		return nil, d.pauseUntil
	}
	held := d.held     // keys behind an event that backs off, or picked now
	paused := d.paused // keys behind an event of a paused topic
	seqs := d.seqs     // rows picked now (a row read twice goes once at a time)
	clear(held)
	clear(paused)
	clear(seqs)
	parked, nPaused := 0, 0
	d.scan = max(d.scan, d.head)
	for d.scan < len(d.fifo) {
		if e := d.fifo[d.scan]; !e.done && e.barrier == nil && !e.inFlight {
			break
		}
		d.scan++
	}
	for _, e := range d.fifo[d.scan:] {
		if e.done || e.barrier != nil || e.inFlight {
			continue // an event in flight has its key in d.busy
		}
		k := e.row.PartitionKey
		if pausing && (k != "" && paused[k] || r.fwd.Paused(e.row.Topic)) {
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
		if (k != "" && (held[k] || d.busy[k])) || seqs[e.row.Seq] || d.busySeqs[e.row.Seq] {
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
	d.inFlight++
	if k := e.row.PartitionKey; k != "" {
		d.busy[k] = true
	}
	d.busySeqs[e.row.Seq] = true
	row, fwd, ctx, done := e.row, d.s.r.fwd, d.pubCtx, d.done
	go func() { done <- completion{e: e, del: fwd.PublishRow(ctx, row)} }()
}

// complete records a row's outcome: published, failed (it backs off, its key's later rows behind
// it, or is dead-lettered), or released untouched (a paused topic, the broker unreachable or its
// circuit open, or stop ended): it goes again when it may.
func (d *dispatcher) complete(c completion) {
	e, del := c.e, c.del
	d.inFlight--
	e.inFlight = false
	if k := e.row.PartitionKey; k != "" {
		delete(d.busy, k)
	}
	delete(d.busySeqs, e.row.Seq)
	if len(del.Published) > 0 || len(del.Failed) > 0 {
		d.probing = false // the broker answered: the circuit is closed
	}
	if del.UnreachableErr != nil || del.CircuitOpen {
		d.probing = true
	}
	if del.CircuitOpen {
		d.pauseUntil = del.RetryAt
	}
	if len(del.Published) > 0 {
		e.done = true
		d.doneBehind++
		e.row.Payload, e.row.Metadata = nil, nil
		return
	}
	d.scan = d.head // e is behind it, and not done unless dead-lettered
	for _, f := range del.Failed {
		e.row.Attempts++
		if f.DeadLettered {
			d.deadLetter(e, f.Error)
			e.done = true
			d.doneBehind++
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

// deadLetterBad dead-letters the messages that do not decode: they are kept for an operator, and
// the slot moves past them.
func (d *dispatcher) deadLetterBad(ctx context.Context) error {
	for len(d.bad) > 0 {
		e := d.bad[0]
		e.row.UUID = uuid.NewString()
		e.row.Topic = "outboxkit.undecodable"
		d.deadLetter(e, fmt.Sprintf("a logical decoding message with the outbox's prefix at %s does not decode: %v", e.lsn, e.bad))
		d.s.r.log.Error("Undecodable outbox message dead-lettered", e.bad, d.s.r.fields.Add(watermill.LogFields{"lsn": e.lsn.String()}))
		e.row.Payload = nil
		d.bad = d.bad[1:]
	}
	return nil
}

// deadRow is a dead letter to write with the next checkpoint.
type deadRow struct {
	row     store.OutboxRow
	delKey  string // the outbox row's uuid; "" for an event of the log, written as a row
	xid     uint32 // the row's writer, see flush
	errText string
	at      time.Time
}

// deadLetter parks an event the broker keeps refusing, in the outbox, for an operator: it is
// written in the transaction of the next checkpoint, which is the first to move past it — so the
// slot never moves past a dead letter that was not written.
func (d *dispatcher) deadLetter(e *entry, errText string) {
	d.pendingDead = append(d.pendingDead, deadRow{row: e.row, delKey: e.delKey, xid: e.xid, errText: errText, at: d.s.r.fcfg.Now()})
}

// writeDeadLetter writes dl in tx: an outbox row is marked, an event of the log is written as a
// dead-lettered row (which the relay, reading it back, skips).
func (d *dispatcher) writeDeadLetter(ctx context.Context, tx pgx.Tx, dl deadRow) error {
	r := d.s.r
	var err error
	if dl.delKey != "" {
		_, err = tx.Exec(ctx, r.sql.DeadLetterRow, dl.delKey, dl.row.Attempts, dl.errText, dl.at)
	} else {
		key, text := pgsql.StoredID(dl.row.UUID)
		var pkey any
		if dl.row.PartitionKey != "" {
			pkey = dl.row.PartitionKey
		}
		metadata := string(dl.row.Metadata)
		if metadata == "" {
			metadata = "{}"
		}
		payload := dl.row.Payload
		if payload == nil {
			payload = []byte{}
		}
		_, err = tx.Exec(ctx, r.sql.DeadLetterEvent, key, text, dl.row.Topic, pkey, payload, metadata, dl.row.CreatedAt, dl.row.Attempts, dl.errText, dl.at)
	}
	if err != nil {
		return fmt.Errorf("dead-letter event %s: %w", dl.row.UUID, err)
	}
	return nil
}

// writeParked writes, in tx, an event of the log parked behind its key's dead letter as an outbox
// row waiting to be published: the polling relay, the console and a later check see it as any row
// of a parked key.
func (d *dispatcher) writeParked(ctx context.Context, tx pgx.Tx, row store.OutboxRow) error {
	key, text := pgsql.StoredID(row.UUID)
	metadata := string(row.Metadata)
	if metadata == "" {
		metadata = "{}"
	}
	payload := row.Payload
	if payload == nil {
		payload = []byte{}
	}
	_, err := tx.Exec(ctx, d.s.r.sql.ParkEvent, key, text, row.Topic, row.PartitionKey, payload, metadata, row.CreatedAt)
	if err != nil {
		return fmt.Errorf("park event %s: %w", row.UUID, err)
	}
	return nil
}

// advance drops the done entries at the head of the window; passing a transaction's end makes its
// position confirmable.
func (d *dispatcher) advance() {
	for d.head < len(d.fifo) && (d.fifo[d.head].done || d.fifo[d.head].barrier != nil) {
		e := d.fifo[d.head]
		if e.end > 0 {
			d.confirmable = max(d.confirmable, e.end)
		} else if e.delKey != "" && !e.readBack {
			d.queueDelete(e)
		}
		for _, g := range e.barrier {
			if g.delKey != "" { // published: neither dead-lettered nor parked again
				d.queueDelete(g)
			}
		}
		d.fifo[d.head] = nil
		d.head++
		d.popped += 1 + e.extra
	}
	// Compaction walks the whole window. The loop turns at each outcome, so a full window is
	// compacted once a sixteenth of it is done — which keeps the walk to a few entries an outcome
	// while a backlog keeps the window full — or at once when nothing is in flight, when no outcome
	// will come to make room.
	if w := d.s.r.cfg.Window; d.window() >= w && d.doneBehind > 0 && (d.inFlight == 0 || d.doneBehind >= w/16) {
		d.compact()
	}
	if d.head > 1024 && d.head > len(d.fifo)/2 {
		d.fifo = append(d.fifo[:0], d.fifo[d.head:]...)
		d.scan = max(d.scan-d.head, 0)
		d.head = 0
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
	kept := d.fifo[:d.head]
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
	rest := append([]*entry(nil), d.fifo[d.head:]...)
	for _, e := range rest {
		if e.done {
			run = append(run, e)
			continue
		}
		closeRun()
		kept = append(kept, e)
	}
	closeRun()
	clear(d.fifo[len(kept):])
	d.fifo = kept
	d.doneBehind = 0
	d.scan = d.head
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
	if d.flushing != nil {
		return
	}
	j := d.takeFlush()
	if j == nil {
		return
	}
	ch := make(chan checkpointDone, 1)
	d.flushing = ch
	go func() { ch <- d.runFlush(ctx, j) }()
}

// awaitFlush waits for the checkpoint running beside the loop, if any, and records it.
func (d *dispatcher) awaitFlush() error {
	if d.flushing == nil {
		return nil
	}
	res := <-d.flushing
	d.flushing = nil
	return d.flushed(res)
}

// flushJob is one checkpoint's work, taken from the dispatcher's state when it starts.
type flushJob struct {
	del         []string // published rows' uuids
	xids        []uint32 // their writers' transaction ids (0s left out)
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
	d.lastFlush = time.Now()
	if len(d.pendingDel) == 0 && len(d.pendingDead) == 0 && len(d.pendingPark) == 0 && d.confirmable == d.flushedLSN {
		d.s.flushed.Store(d.popped)
		return nil
	}
	r := d.s.r
	j := &flushJob{del: d.pendingDel, xids: d.pendingXids, dead: d.pendingDead, park: d.pendingPark,
		confirmable: d.confirmable, popped: d.popped}
	if r.hooks.hideRows > 0 && len(j.del) > 0 {
		r.hooks.hideRows--
		j.hide = true // as a snapshot that does not see them yet
	}
	for _, dl := range d.pendingDead {
		k := dl.row.PartitionKey
		if from, ok := d.parked[k]; ok && k != "" && dl.delKey == "" && from == dl.row.Seq {
			if j.parkFrom == nil {
				j.parkFrom = map[string]int64{}
			}
			j.parkFrom[k] = from
		}
	}
	d.pendingDel, d.pendingXids, d.pendingDead, d.pendingPark = nil, nil, nil, nil
	return j
}

// flushed records a checkpoint that came back: the position it recorded is confirmed to the server.
func (d *dispatcher) flushed(res checkpointDone) error {
	if res.err != nil {
		return res.err
	}
	j := res.job
	for k, seq := range res.parkedAt {
		if from, ok := d.parked[k]; ok && from == j.parkFrom[k] {
			d.parked[k] = seq // the key waits from the dead letter's row now, not from its place in the log
		}
	}
	d.flushedLSN = j.confirmable
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
	d.pendingDel = append(d.pendingDel, e.delKey)
	if e.xid != 0 && (len(d.pendingXids) == 0 || d.pendingXids[len(d.pendingXids)-1] != e.xid) {
		d.pendingXids = append(d.pendingXids, e.xid)
	}
}

// waitVisible returns once no transaction of xids is still running in a new snapshot: their
// commits, which the log has sent, are then visible to the relay's statements. It asks again every
// few milliseconds; a commit is visible a moment after the log sends it, so a wait of seconds is an
// error (the session restarts and reads again from the confirmed position).
func (d *dispatcher) waitVisible(ctx context.Context, xids []uint32) error {
	if len(xids) == 0 {
		return nil
	}
	ids := make([]int64, len(xids))
	for i, x := range xids {
		ids[i] = int64(x)
	}
	const limit = 10 * time.Second
	deadline := time.Now().Add(limit)
	for {
		var running int
		// pgoutput's 32-bit transaction ids are taken to the snapshot's 64-bit ones in the statement.
		err := d.s.r.cfg.Pool.QueryRow(ctx, d.s.r.sql.RunningXids, ids).Scan(&running)
		if err != nil {
			return fmt.Errorf("check that the published rows' transactions are visible: %w", err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d transactions the log sent as committed are still running after %s: cannot remove their rows", running, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
