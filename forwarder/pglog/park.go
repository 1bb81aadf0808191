package pglog

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/store"
)

// parkState is, with ParkKeyOnDeadLetter, the keys parked behind a dead letter, each with the seq
// from which its events wait (the dead letter's). A parked event is left in the outbox table — in
// WAL mode written there (rows), with the next checkpoint — and the slot moves past it; a replay
// or an archive of the dead letter reads the key's rows back from the table (check).
type parkState struct {
	keys      map[string]int64
	rows      []store.OutboxRow // WAL mode: parked events of the log, written as outbox rows at the next flush
	xids      []uint32          // writers of the parked rows read from the log, for check's wait
	checkKeys map[string]bool   // parked keys whose replayed dead letter the current transaction carries
	checkXids []uint32
	// Per key, the highest seq read back from the table: a replayed dead letter at or below it
	// whose INSERT arrives after check unparked its key, and in WAL mode the relay's own parked
	// row come back through the log, were published already.
	drained map[string]int64
}

// parkEvent leaves e, an event of a parked key, unpublished for good in this session: a row of the
// outbox stays there; an event of the log is written there with the next checkpoint.
func (d *dispatcher) parkEvent(e *entry) {
	e.done = true
	d.window.doneBehind++
	if e.delKey != "" {
		e.delKey = ""
		d.park.xids = appendXid(d.park.xids, e.xid)
	} else {
		d.park.rows = append(d.park.rows, e.row)
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
	if from, ok := d.park.keys[key]; ok && from <= seq {
		return
	}
	d.park.keys[key] = seq
	for _, e := range d.window.fifo[d.window.head:] {
		if !e.done && e.end == 0 && e.bad == nil && e.row.PartitionKey == key && e.row.Seq > seq {
			d.parkEvent(e)
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
	if len(d.park.rows) > 0 || len(d.dead.pending) > 0 {
		// The events parked since the last flush, and the dead letters, into the table first.
		if err := d.flush(ctx); err != nil {
			return err
		}
	}
	if err := d.waitVisible(ctx, append(d.park.checkXids, d.park.xids...)); err != nil {
		return err
	}
	d.park.checkXids, d.park.xids = nil, nil
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
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
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
		} else if seq, ok := d.park.keys[k]; ok {
			lo[k] = seq
		} else {
			lo[k] = math.MaxInt64
		}
		if seq := from[k]; park && seq > 0 {
			d.park.keys[k] = seq
		} else {
			delete(d.park.keys, k)
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
		if seq, ok := d.park.keys[k]; (ok && it.row.Seq >= seq) || it.row.Seq < lo[k] {
			continue // still parked, or not parked
		}
		d.park.drained[k] = max(d.park.drained[k], it.row.Seq)
		// Not an item of the reader: it counts for none (see advance's popped).
		e := &entry{item: it, extra: -1, readBack: true}
		d.window.fifo = append(d.window.fifo, e)
		group = append(group, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read back the rows of unparked keys: %w", err)
	}
	if n := len(group); n > 0 {
		d.window.fifo = append(d.window.fifo, &entry{extra: -1, barrier: group})
		r.log.Info("Log relay read back the events of keys no longer parked behind a dead letter", r.fields.Add(watermill.LogFields{"events": n}))
	}
	return tx.Commit(cctx)
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
