package pglog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
)

// With a transactional publisher (forwarder.SourceRelay.Transactions: the Kafka backend with a
// transactional_id), the relay publishes exactly once into the broker: what a consumer reading
// only committed records (Kafka's read_committed) sees holds each event once, in each key's
// order, whatever point the relay died at.
//
// A transaction spans from one checkpoint to the next. At a checkpoint no new row starts, the
// rows in flight finish, and the transaction commits with a progress record of the relay's (the
// rows the broker has that a restart may read again); then the checkpoint's statement removes
// the published rows and records the position, and publishing goes on in a new transaction. A
// row published in the open transaction is not behind the window's head until it commits: the
// position never passes it and no checkpoint removes it, so whatever the table and the slot say
// is published, the broker has committed.
//
// What a restart reads again, and how it knows the broker has it. The slot replays from its
// confirmed position. The relay confirms a position only once the checkpoint that recorded it in
// log_relays has run (one statement with the removal), and the status goes out every
// StatusInterval: so the slot is at or behind the position in log_relays (or ahead of it at the
// server's WAL end, confirmed while idle, with nothing unpublished between), and the INSERTs
// between the two come again although their rows were removed. Without transactions pglog
// publishes such a replayed INSERT again: the log carries the event whole, and the checkpoint's
// count of removed rows falling short is taken for a writer's commit not yet visible, or for a row
// removed before (a duplicate, never a loss). With them, the relay reads the position in
// log_relays after it took the group over (Recover): the events of every transaction that
// committed below it were handled by a checkpoint that ran — published in a committed transaction
// and removed, dead-lettered, or parked (left in, or written to, the table) — and are skipped
// without touching the table, before any parking. Beyond that position, the progress of the
// group's last committed transaction lists by seq every row the broker has that is not known
// safe yet: published after the head (rows of many keys flow past a key that waits), compacted
// out of the window, queued for a removal that has not run, read from the table (a backfill, a
// key read back behind a dead letter). Those are skipped when they come again, and their rows
// removed as a checkpoint would; the others are published. Each progress lists the last one's
// rows again until the session has read past the highest position they name. A row read twice in
// one session (from the table and from the log) is skipped the second time.
//
// A backfill read without the slot's snapshot (the relay died in its first backfill) would read
// rows the log carries too, and one removed after it was published would come again from the log:
// in table mode the relay drops the slot and makes it again, with a snapshot, as after a lost one
// (the rows left in the outbox are every event not yet handled).
//
// A row that does not come back published (failed at the broker, unreachable, or released after
// being sent) aborts the transaction at once: franz-go fails the transaction's producer id on a
// sequence or epoch error (a commit is then not even attempted), and a produce that timed out may
// still land in the transaction — committing the others would make visible a record the relay
// counts as not published and sends again. The rows the aborted transaction published go again,
// each key in order, in the next one; the failed row backs off or is dead-lettered as without
// transactions.

// progressSource marks a progress record as the log relay's: the polling relay (forwarder.Run)
// writes the same shape without it.
const progressSource = "pglog"

// txnProgress is the progress a transaction of the log relay commits. Its version, relay, outbox
// and published fields are the polling relay's (forwarder/txn.go), so a polling relay taking the
// group over marks the rows it lists, which the broker has; the log relay refuses a polling
// relay's record, whose rows it could not place in the log.
type txnProgress struct {
	Version int    `json:"version"`
	Source  string `json:"source"` // progressSource
	Relay   string `json:"relay"`  // the relay group: the forwarder's Name
	Outbox  string `json:"outbox"` // the store's name and schema
	Slot    string `json:"slot"`
	// Published are the seqs of the rows the broker has that a restart may read again, as
	// inclusive ranges, ascending.
	Published [][2]int64 `json:"published"`
	// Through is the highest commit position of the log among them ("0/0": none was read from the
	// log): once a session has read past it, none of them comes again.
	Through string    `json:"through"`
	At      time.Time `json:"at"`
}

const txnProgressVersion = 1

// maxProgressSeqs bounds the seqs a progress record may list: a record lists at most a window
// and a transaction of rows, far fewer.
const maxProgressSeqs = 1 << 22

// txnState is the transactions of a transactional publisher; pub is nil without one.
type txnState struct {
	pub forwarder.TransactionalPublisher
	// ready: the group's last progress has been read (the session's recovery item): rows may go.
	ready bool
	open  bool           // Begin was called and neither Commit nor Abort since
	rows  []*entry       // published in the open transaction (pending), as their outcomes came back
	seqs  map[int64]bool // their seqs: a row read twice joins its first copy
	// poisoned: a row of the open transaction did not come back published; it cannot commit.
	poisoned bool
	fenced   error // the publisher's refusal of this relay, from a row's outcome

	// committed are the rows the broker's committed transactions hold that a restart may read
	// again. A row leaves once checkpoints that ran have removed the copy read from the table, if
	// any, and recorded a position past the copy read from the log, if any.
	committed map[int64]committedRow
	// carried is the group's last progress as this session read it, listed in each progress until
	// a checkpoint records a position past carriedThrough.
	carried        map[int64]bool
	carriedThrough pglogrepl.LSN
	// below is the position log_relays held when the session took the group over: the events of
	// transactions that committed below it were handled by a checkpoint that ran.
	below pglogrepl.LSN
}

// committedRow is where a row of txnState.committed may be read again from.
type committedRow struct {
	pos     pglogrepl.LSN // the commit position of its copy read from the log; 0: none
	inTable bool          // a copy read from the table (a backfill, a read-back) not yet removed
}

// note records that the broker has e, read from the log or from the table.
func (t *txnState) note(e *entry) {
	c := t.committed[e.row.Seq]
	c.pos = max(c.pos, e.commit)
	c.inTable = c.inTable || e.commit == 0
	t.committed[e.row.Seq] = c
}

// txnRecovery is what the session read when it took the group over, handed to the dispatcher
// before any row may go.
type txnRecovery struct {
	carried map[int64]bool
	through pglogrepl.LSN
	below   pglogrepl.LSN
}

func newTxnState(pub forwarder.TransactionalPublisher) txnState {
	return txnState{pub: pub, seqs: map[int64]bool{}, committed: map[int64]committedRow{}}
}

// recoverTxn takes the relay group over — the publisher fences every earlier relay of it and
// aborts the transaction it left open — reads the progress of its last committed transaction,
// then the position log_relays holds (read after the fence: a fenced relay can commit nothing
// more, so the position names everything it committed before it), and hands them to the
// dispatcher. belowFromTable is false when the table's position says nothing of the log the
// session reads (a new slot).
func (s *session) recoverTxn(ctx context.Context, pub forwarder.TransactionalPublisher, belowFromTable bool) error {
	r := s.r
	rctx, cancel := context.WithTimeout(ctx, r.fcfg.PublishTimeout+30*time.Second)
	defer cancel()
	raw, err := pub.Recover(rctx)
	if err != nil {
		if outboxkit.IsFenced(err) {
			return fatalError{fmt.Errorf("take the relay group over: %w", err)}
		}
		return fmt.Errorf("read the relay group's last transaction: %w", err)
	}
	rec, err := r.parseProgress(raw)
	if err != nil {
		return err
	}
	if belowFromTable {
		cp, err := r.readCheckpoint(ctx)
		if err != nil {
			return err
		}
		rec.below = cp.confirmed
	}
	r.log.Info("Log relay took its relay group's transactions over", r.fields.Add(watermill.LogFields{
		"committed_rows": len(rec.carried), "through": rec.through.String(), "below": rec.below.String(),
	}))
	never := time.Now().Add(time.Hour) // before streaming: no status to send
	return s.send(ctx, item{recovery: rec}, &never)
}

// parseProgress reads the group's last progress record (nil: none yet).
func (r *Relay) parseProgress(raw []byte) (*txnRecovery, error) {
	rec := &txnRecovery{carried: map[int64]bool{}}
	if raw == nil {
		return rec, nil
	}
	var p txnProgress
	if err := json.Unmarshal(raw, &p); err != nil || p.Version != txnProgressVersion {
		return nil, fatal("the relay group's last progress record is not one this build reads (version %d, %v): "+
			"give this relay a transactional id of its own", p.Version, err)
	}
	if p.Source != progressSource {
		return nil, fatal("the relay group's last transaction was committed by a polling relay (forwarder.Run), whose rows the log relay " +
			"cannot place in the log: give the log relay a transactional id of its own (after the polling relay stopped cleanly)")
	}
	if p.Outbox != r.outboxName() || p.Relay != r.fcfg.Name {
		return nil, fatal("the transactional id carries the progress of relay group %s of outbox %s, not of %s of %s: "+
			"each relay group needs a transactional id of its own", p.Relay, p.Outbox, r.fcfg.Name, r.outboxName())
	}
	n := 0
	for _, rg := range p.Published {
		if rg[1] < rg[0] || n+int(rg[1]-rg[0]) >= maxProgressSeqs {
			return nil, fatal("the relay group's last progress record lists range %d-%d, beyond what one relay holds", rg[0], rg[1])
		}
		for v := rg[0]; v <= rg[1]; v++ {
			rec.carried[v] = true
			n++
		}
	}
	through, err := pglogrepl.ParseLSN(p.Through)
	if err != nil {
		return nil, fatal("the relay group's last progress record: position %q: %v", p.Through, err)
	}
	rec.through = through
	return rec, nil
}

func (r *Relay) outboxName() string {
	info := r.fcfg.Store.Info()
	return info.Name + ":" + info.Schema
}

// recovered takes the session's recovery in: from now on rows may go. The rows already in the
// window (a key's rows read back at the session's start) are looked at as they would have been
// on arrival.
func (d *dispatcher) recovered(rec *txnRecovery) {
	t := &d.txn
	t.carried, t.carriedThrough, t.below, t.ready = rec.carried, rec.through, rec.below, true
	for _, e := range d.window.fifo[d.window.head:] {
		if !e.done && !e.inFlight && e.barrier == nil && e.end == 0 && e.bad == nil {
			d.skipCommitted(e)
		}
	}
}

// skipCommitted marks done, without publishing it, a row the broker has already: one the
// position below covers (handled by a checkpoint that ran: nothing to remove), or one a progress
// lists or this session committed (its row is removed as a checkpoint would). It reports whether
// it did.
func (d *dispatcher) skipCommitted(e *entry) bool {
	t := &d.txn
	seq := e.row.Seq
	switch {
	case e.commit > 0 && e.commit < t.below:
		e.delKey = ""
	case t.carried[seq]:
		t.note(e)
	default:
		if _, ok := t.committed[seq]; !ok {
			return false
		}
		t.note(e)
	}
	e.done = true
	d.window.doneBehind++
	e.row.Payload, e.row.Metadata = nil, nil
	return true
}

// joinsOpen is skipCommitted for a row about to start: a row read twice in the session whose
// first copy the open transaction holds joins it (an abort sends both again, and the second
// joins again), and one whose first copy committed since it arrived is skipped.
func (d *dispatcher) joinsOpen(e *entry) bool {
	if d.txn.seqs[e.row.Seq] {
		e.done, e.pending = true, true
		d.window.doneBehind++
		d.txn.rows = append(d.txn.rows, e)
		return true
	}
	return d.skipCommitted(e)
}

// beginTxn opens the transaction the next rows go in, unless one is open.
func (d *dispatcher) beginTxn(ctx context.Context) error {
	t := &d.txn
	if t.open {
		return nil
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.s.r.fcfg.PublishTimeout)
	defer cancel()
	if err := t.pub.Begin(bctx); err != nil {
		return txnError("begin a transaction", err)
	}
	t.open = true
	return nil
}

// txnDue reports whether the open transaction is to end now: a row of it failed, it holds
// FlushRows rows, FlushInterval has passed since the last checkpoint, or its rows fill much of a
// full window (they leave it only once committed).
func (d *dispatcher) txnDue() bool {
	t := &d.txn
	if !t.open {
		return false
	}
	r := d.s.r
	return t.poisoned || len(t.rows) >= r.cfg.FlushRows || time.Since(d.checkpoint.last) >= r.cfg.FlushInterval ||
		(d.window.len() >= r.cfg.Window && len(t.rows) >= max(1, r.cfg.Window/16))
}

// checkpointTxn is a checkpoint with transactions: the open transaction ends (endTxn), then the
// checkpoint's statement starts beside the loop, on what the commit left behind the head.
func (d *dispatcher) checkpointTxn(ctx, stop context.Context) error {
	if err := d.endTxn(ctx, stop); err != nil {
		return err
	}
	if err := d.awaitFlush(); err != nil {
		return err
	}
	d.startFlush(ctx)
	return nil
}

// errCrashed is the afterCommit hook's crash: the dispatcher stops as a killed process would.
var errCrashed = errors.New("crashed after the commit, before the checkpoint")

// endTxn ends the open transaction, if any: the rows in flight finish (none starts meanwhile:
// the loop alone starts rows, and it waits here), then it commits with the progress, or aborts
// when a row of it failed and sends its rows again. A commit that fails ends the session: only
// the broker knows whether it took effect, and the next session asks it (Recover).
func (d *dispatcher) endTxn(ctx, stop context.Context) error {
	t := &d.txn
	for d.publish.inFlight > 0 {
		d.complete(<-d.publish.done)
	}
	if t.fenced != nil {
		return fatalError{t.fenced}
	}
	if !t.open {
		return nil
	}
	r := d.s.r
	t.open = false
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.fcfg.PublishTimeout)
	defer cancel()
	if t.poisoned || len(t.rows) == 0 {
		err := t.pub.Abort(cctx)
		n := d.txnAborted()
		if err != nil {
			return txnError("abort the transaction", err)
		}
		if n > 0 {
			r.log.Debug("Log relay aborted a transaction after a failed publish: its rows go again", r.fields.Add(watermill.LogFields{"rows": n}))
		}
		return nil
	}
	progress, err := d.progress()
	if err != nil {
		_ = t.pub.Abort(cctx)
		d.txnAborted()
		return err
	}
	if err := t.pub.Commit(cctx, progress); err != nil {
		return txnError("commit the transaction", err)
	}
	d.txnCommitted()
	if r.hooks.afterCommit != nil {
		r.hooks.afterCommit()
		if r.hooks.crash && stop.Err() != nil {
			return errCrashed
		}
	}
	d.advance()
	return nil
}

// txnError is err of the transaction's step what: fatal when the publisher is fenced.
func txnError(what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	if outboxkit.IsFenced(err) {
		return fatalError{err}
	}
	return err
}

// progress is the record the open transaction commits: every row the broker will have, once it
// commits, that a restart may read again.
func (d *dispatcher) progress() ([]byte, error) {
	t := &d.txn
	r := d.s.r
	seqs := slices.Collect(maps.Keys(t.committed))
	through := t.carriedThrough
	for _, c := range t.committed {
		through = max(through, c.pos)
	}
	for _, e := range t.rows {
		seqs = append(seqs, e.row.Seq)
		through = max(through, e.commit)
	}
	for seq := range t.carried {
		seqs = append(seqs, seq)
	}
	if len(seqs) > maxProgressSeqs {
		return nil, fmt.Errorf("the transaction's progress would list %d rows, more than %d: lower Window", len(seqs), maxProgressSeqs)
	}
	return json.Marshal(txnProgress{Version: txnProgressVersion, Source: progressSource, Relay: r.fcfg.Name, Outbox: r.outboxName(),
		Slot: r.cfg.SlotName, Published: seqRanges(seqs), Through: through.String(), At: r.fcfg.Now().UTC()})
}

// txnCommitted records the open transaction's rows as the broker's: they may leave the window.
func (d *dispatcher) txnCommitted() {
	t := &d.txn
	for _, e := range t.rows {
		e.pending = false
		t.note(e)
		e.row.Payload, e.row.Metadata = nil, nil
	}
	t.rows = t.rows[:0]
	clear(t.seqs)
	t.poisoned = false
}

// txnAborted puts the aborted transaction's rows back to be published again, and returns how many.
func (d *dispatcher) txnAborted() int {
	t := &d.txn
	n := len(t.rows)
	for _, e := range t.rows {
		e.done, e.pending = false, false
		d.window.doneBehind = max(d.window.doneBehind-1, 0)
	}
	if n > 0 {
		d.publish.scan = d.window.head
	}
	t.rows = t.rows[:0]
	clear(t.seqs)
	t.poisoned = false
	return n
}

// txnFlushed forgets the committed rows checkpoints that ran made safe: read from the log below
// the position this one recorded (their removal was queued before the position passed them), and
// read from the table and removed. Past the carried list's highest position, the session has
// read again every row of it that comes again.
func (d *dispatcher) txnFlushed(j *flushJob) {
	t := &d.txn
	for _, seq := range j.tableSeqs {
		if c, ok := t.committed[seq]; ok {
			c.inTable = false
			t.committed[seq] = c
		}
	}
	for seq, c := range t.committed {
		if !c.inTable && (c.pos == 0 || c.pos < j.confirmable) {
			delete(t.committed, seq)
		}
	}
	if t.ready && len(t.carried) > 0 && j.confirmable > t.carriedThrough {
		t.carried = nil
	}
}

// abortOpen aborts the transaction a failed session leaves open: none of its rows is visible,
// and the next session reads them again.
func (d *dispatcher) abortOpen(ctx context.Context) {
	t := &d.txn
	if !t.open {
		return
	}
	t.open = false
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.s.r.fcfg.PublishTimeout)
	defer cancel()
	if err := t.pub.Abort(actx); err != nil && !outboxkit.IsFenced(err) {
		d.s.r.log.Error("Cannot abort the open transaction; the broker aborts it when the relay group's next publisher starts", err, d.s.r.fields)
	}
	d.txnAborted()
}

// seqRanges turns seqs into ascending inclusive ranges, duplicates merged.
func seqRanges(seqs []int64) [][2]int64 {
	slices.Sort(seqs)
	var out [][2]int64
	for _, v := range seqs {
		if n := len(out); n > 0 && (v == out[n-1][1] || v == out[n-1][1]+1) {
			out[n-1][1] = v
			continue
		}
		out = append(out, [2]int64{v, v})
	}
	return out
}
