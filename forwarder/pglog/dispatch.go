package pglog

import (
	"context"
	"crypto/md5"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/store"
)

// entry is an item in the dispatcher's window, oldest first.
type entry struct {
	item
	done   bool // published or dead-lettered; a transaction's end is always done
	nextAt time.Time
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

// dispatcher publishes the items in rounds through the forwarder and moves the confirmed position
// over the transactions whose events are all done.
type dispatcher struct {
	s      *session
	fifo   []*entry
	head   int
	popped int64 // items that left the window

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
	return &dispatcher{s: s, lastFlush: time.Now(), parked: map[string]int64{}, checkKeys: map[string]bool{}, drained: map[string]int64{}}
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
	rows, err := tx.Query(cctx, fmt.Sprintf(`SELECT partition_key, coalesce(min(seq) FILTER (WHERE dead_lettered_at IS NOT NULL AND archived_at IS NULL), 0)
		FROM %s WHERE (dead_lettered_at IS NOT NULL OR last_error IS NOT NULL) AND published_at IS NULL AND partition_key IS NOT NULL
		AND ($1::text[] IS NULL OR partition_key = ANY($1)) GROUP BY partition_key`, r.table("outbox")), keys)
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
	rows, err = tx.Query(cctx, fmt.Sprintf(`SELECT `+rowColumns+`
		FROM %s WHERE partition_key = ANY($1) AND published_at IS NULL AND dead_lettered_at IS NULL ORDER BY seq`, r.table("outbox")), keys)
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
// published, and what was published is flushed (unless the crash hook says otherwise).
func (d *dispatcher) run(ctx, stop context.Context) (err error) {
	r := d.s.r
	defer func() {
		if err != nil {
			close(d.s.failed)
			for range d.s.in { // let the reader finish
			}
		}
	}()
	flushTick := time.NewTicker(r.cfg.FlushInterval)
	defer flushTick.Stop()
	open := true
	for open {
		// Take what is waiting, up to the window.
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
		if err := d.deadLetterBad(ctx); err != nil {
			return err
		}
		now := r.fcfg.Now()
		// Taken before the pauses are read: a resume after this closes it.
		pausesChanged := r.fwd.PausesChanged()
		var batch []*entry
		wakeAt := time.Time{}
		if stop.Err() == nil {
			batch, wakeAt = d.eligible(now)
		}
		if len(batch) > 0 {
			if err := d.publish(ctx, stop, batch); err != nil {
				return err
			}
			d.advance()
			if len(d.pendingDel) >= r.cfg.FlushRows || time.Since(d.lastFlush) >= r.cfg.FlushInterval {
				if err := d.flush(ctx); err != nil {
					return err
				}
			}
			continue
		}
		d.advance()
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
			if err := d.flush(ctx); err != nil {
				return err
			}
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
	if err := d.deadLetterBad(ctx); err != nil {
		return err
	}
	d.advance()
	if r.hooks.crash && stop.Err() != nil {
		return nil // as a killed process: nothing flushed, nothing confirmed
	}
	return d.flush(ctx)
}

// eligible picks the next round: in commit order, each key's rows from its oldest not done one,
// while due; a key whose oldest row backs off, or is of a paused topic, holds its later rows (of
// every topic, as the polling relay's claim does). A paused relay publishes nothing.
func (d *dispatcher) eligible(now time.Time) (batch []*entry, wakeAt time.Time) {
	r := d.s.r
	pausing := r.fwd.Pausing()
	if !pausing {
		r.held.Store(0)
	}
	if r.fwd.RelayPaused() {
		n := 0
		for _, e := range d.fifo[d.head:] {
			if !e.done && e.barrier == nil {
				n++
			}
		}
		r.held.Store(int64(n))
		return nil, time.Time{}
	}
	if now.Before(d.pauseUntil) {
		return nil, d.pauseUntil
	}
	held := map[string]bool{}   // keys behind an event that backs off
	paused := map[string]bool{} // keys behind an event of a paused topic
	seqs := map[int64]bool{}    // a row read twice (backfill and log) goes in one round at a time
	parked, nPaused := 0, 0
	limit := r.fcfg.BatchSize
	for _, e := range d.fifo[d.head:] {
		if e.done || e.barrier != nil {
			continue
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
			if !pausing {
				break
			}
			continue // counting what the pauses hold
		}
		if (k != "" && held[k]) || seqs[e.row.Seq] {
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
		seqs[e.row.Seq] = true
	}
	r.parked.Store(int64(parked))
	if pausing {
		r.held.Store(int64(nPaused))
	}
	return batch, wakeAt
}

// publish sends one round through the forwarder's publish path and records its outcome.
func (d *dispatcher) publish(ctx, stop context.Context, batch []*entry) error {
	rows := make([]store.OutboxRow, len(batch))
	bySeq := make(map[int64]*entry, len(batch))
	for i, e := range batch {
		rows[i] = e.row
		bySeq[e.row.Seq] = e
	}
	del := d.s.r.fwd.PublishRows(stop, rows)
	for _, seq := range del.Published {
		e := bySeq[seq]
		e.done = true
		d.doneBehind++
		e.row.Payload, e.row.Metadata = nil, nil
	}
	for _, f := range del.Failed {
		e := bySeq[f.Seq]
		e.row.Attempts++
		if f.DeadLettered {
			if err := d.deadLetter(ctx, e, f.Error); err != nil {
				return err
			}
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
	if del.CircuitOpen {
		d.pauseUntil = del.RetryAt
	}
	return nil
}

// deadLetterBad dead-letters the messages that do not decode: they are kept for an operator, and
// the slot moves past them.
func (d *dispatcher) deadLetterBad(ctx context.Context) error {
	for len(d.bad) > 0 {
		e := d.bad[0]
		e.row.UUID = uuid.NewString()
		e.row.Topic = "outboxkit.undecodable"
		if err := d.deadLetter(ctx, e, fmt.Sprintf("a logical decoding message with the outbox's prefix at %s does not decode: %v", e.lsn, e.bad)); err != nil {
			return err
		}
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
func (d *dispatcher) deadLetter(_ context.Context, e *entry, errText string) error {
	d.pendingDead = append(d.pendingDead, deadRow{row: e.row, delKey: e.delKey, xid: e.xid, errText: errText, at: d.s.r.fcfg.Now()})
	return nil
}

// writeDeadLetter writes dl in tx: an outbox row is marked, an event of the log is written as a
// dead-lettered row (which the relay, reading it back, skips).
func (d *dispatcher) writeDeadLetter(ctx context.Context, tx pgx.Tx, dl deadRow) error {
	r := d.s.r
	var err error
	if dl.delKey != "" {
		_, err = tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET attempts = $2, last_error = $3, dead_lettered_at = $4
			WHERE uuid = $1::uuid AND published_at IS NULL`, r.table("outbox")),
			dl.delKey, dl.row.Attempts, dl.errText, dl.at)
	} else {
		key, text := storedID(dl.row.UUID)
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
		_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (uuid, uuid_text, topic, partition_key, payload, metadata, created_at,
			attempts, last_error, dead_lettered_at) VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (uuid) DO NOTHING`,
			r.table("outbox")), key, text, dl.row.Topic, pkey, payload, metadata, dl.row.CreatedAt, dl.row.Attempts, dl.errText, dl.at)
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
	key, text := storedID(row.UUID)
	metadata := string(row.Metadata)
	if metadata == "" {
		metadata = "{}"
	}
	payload := row.Payload
	if payload == nil {
		payload = []byte{}
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (uuid, uuid_text, topic, partition_key, payload, metadata, created_at)
		VALUES ($1::uuid, $2, $3, $4, $5, $6, $7) ON CONFLICT (uuid) DO NOTHING`, d.s.r.table("outbox")),
		key, text, row.Topic, row.PartitionKey, payload, metadata, row.CreatedAt)
	if err != nil {
		return fmt.Errorf("park event %s: %w", row.UUID, err)
	}
	return nil
}

// storedID is how the outbox keys a message id (as pgxstore writes it): a canonical lowercase
// UUID as itself, any other id as the UUID-shaped md5 of its text, with the text beside it.
func storedID(id string) (key string, text any) {
	if u, err := uuid.Parse(id); err == nil && u.String() == id {
		return id, nil
	}
	sum := md5.Sum([]byte(id))
	return uuid.UUID(sum).String(), id
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
	if d.window() >= d.s.r.cfg.Window && d.doneBehind > 0 {
		d.compact()
	}
	if d.head > 1024 && d.head > len(d.fifo)/2 {
		d.fifo = append(d.fifo[:0], d.fifo[d.head:]...)
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
}

// flush removes the published rows and records the confirmable position in one statement, then
// lets the reader confirm it to the server: what the server is told is published is gone from
// the table, so the rows left there are what a lost slot's backfill must read.
func (d *dispatcher) flush(ctx context.Context) error {
	d.lastFlush = time.Now()
	if len(d.pendingDel) == 0 && len(d.pendingDead) == 0 && len(d.pendingPark) == 0 && d.confirmable == d.flushedLSN {
		d.s.flushed.Store(d.popped)
		return nil
	}
	r := d.s.r
	if r.hooks.beforeConfirm != nil {
		if err := r.hooks.beforeConfirm(); err != nil {
			return fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	checkpoint := fmt.Sprintf(`WITH removed AS (DELETE FROM %s WHERE uuid = ANY($1::uuid[]) AND dead_lettered_at IS NULL RETURNING 1),
		saved AS (INSERT INTO %s AS c (name, slot_name, mode, confirmed_lsn) VALUES ($2, $3, $4, $5::text::pg_lsn)
		ON CONFLICT (name) DO UPDATE SET confirmed_lsn = GREATEST(c.confirmed_lsn, excluded.confirmed_lsn), mode = excluded.mode, updated_at = now())
		SELECT count(*) FROM removed`,
		r.table("outbox"), r.table("log_relays"))
	del := d.pendingDel
	if r.hooks.hideRows > 0 && len(del) > 0 {
		r.hooks.hideRows--
		del = nil // as a snapshot that does not see them yet
	}
	args := []any{del, r.fcfg.Name, r.cfg.SlotName, string(r.cfg.Mode), d.confirmable.String()}
	var removed int
	var err error
	var parkedAt map[string]int64 // WAL mode: the rows written for dead letters that park their keys
	if len(d.pendingDead) == 0 && len(d.pendingPark) == 0 {
		err = r.cfg.Pool.QueryRow(fctx, checkpoint, args...).Scan(&removed)
	} else {
		// A dead letter is an UPDATE of its row, which must see it (see below).
		var xids []uint32
		for _, dl := range d.pendingDead {
			if dl.delKey != "" && dl.xid != 0 {
				xids = append(xids, dl.xid)
			}
		}
		if err := d.waitVisible(fctx, xids); err != nil {
			return err
		}
		// The dead letters, the parked events of the log after them (so in seq order behind
		// them), and the checkpoint that moves past them, in one transaction.
		parkedAt = map[string]int64{}
		err = pgx.BeginFunc(fctx, r.cfg.Pool, func(tx pgx.Tx) error {
			clear(parkedAt)
			for _, dl := range d.pendingDead {
				if err := d.writeDeadLetter(fctx, tx, dl); err != nil {
					return err
				}
				k := dl.row.PartitionKey
				if from, ok := d.parked[k]; ok && k != "" && dl.delKey == "" && from == dl.row.Seq {
					// The key waits from the dead letter's row now, not from its place in the log.
					var seq int64
					key, _ := storedID(dl.row.UUID)
					if err := tx.QueryRow(fctx, fmt.Sprintf(`SELECT seq FROM %s WHERE uuid = $1::uuid`, r.table("outbox")), key).Scan(&seq); err != nil {
						return fmt.Errorf("read dead letter %s back: %w", dl.row.UUID, err)
					}
					parkedAt[k] = seq
				}
			}
			for _, row := range d.pendingPark {
				if err := d.writeParked(fctx, tx, row); err != nil {
					return err
				}
			}
			return tx.QueryRow(fctx, checkpoint, args...).Scan(&removed)
		})
	}
	if err != nil {
		return fmt.Errorf("remove published outbox rows and record the checkpoint: %w", err)
	}
	if removed < len(d.pendingDel) {
		// Fewer rows removed than published. The server sends a transaction once its commit record
		// is flushed, a moment before the commit is visible to other sessions: a DELETE in that
		// moment misses the row, which would stay in the table forever once the position passes
		// it. (A row read twice, or removed by an earlier session that died before confirming,
		// also counts short; removing again is harmless.) Wait until every writer's commit is
		// visible, then remove again; only then is the server told.
		if err := d.waitVisible(fctx, d.pendingXids); err != nil {
			return err
		}
		_, err := r.cfg.Pool.Exec(fctx, fmt.Sprintf(`DELETE FROM %s WHERE uuid = ANY($1::uuid[]) AND dead_lettered_at IS NULL`,
			r.table("outbox")), d.pendingDel)
		if err != nil {
			return fmt.Errorf("remove published outbox rows: %w", err)
		}
	}
	if len(d.pendingDel) > 4096 {
		d.pendingDel, d.pendingXids = nil, nil
	} else {
		d.pendingDel, d.pendingXids = d.pendingDel[:0], d.pendingXids[:0]
	}
	d.pendingDead, d.pendingPark = nil, nil
	for k, seq := range parkedAt {
		d.parked[k] = seq
	}
	d.flushedLSN = d.confirmable
	d.s.ack.Store(uint64(d.confirmable))
	d.s.flushed.Store(d.popped)
	r.log.Trace("Log relay flushed", r.fields.Add(watermill.LogFields{"confirmed": d.confirmable.String()}))
	return nil
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
		// pgoutput sends 32-bit transaction ids; the snapshot's are 64-bit (epoch and id): an id
		// takes the epoch of the snapshot's xmax, or the one before when that puts it above xmax.
		// A transaction is running for the snapshot when it is at or above xmax, or in its list.
		err := d.s.r.cfg.Pool.QueryRow(ctx, `WITH s AS (SELECT txid_current_snapshot() AS snap),
			e AS (SELECT snap, txid_snapshot_xmax(snap) AS xmax, txid_snapshot_xmax(snap) / 4294967296 * 4294967296 AS epoch FROM s)
			SELECT count(*) FROM e, unnest($1::bigint[]) AS id
			WHERE NOT txid_visible_in_snapshot(CASE WHEN e.epoch + id > e.xmax AND e.epoch > 0 THEN e.epoch + id - 4294967296 ELSE e.epoch + id END, e.snap)`,
			ids).Scan(&running)
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
