package pglog

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/internal/walmsg"
	"github.com/outboxkit/outboxkit/store"
)

// item is what the reader hands the dispatcher, in commit order: an event, or the end of the
// transaction that committed the events before it.
type item struct {
	row    store.OutboxRow
	delKey string        // the outbox row's uuid, removed once published; "" for none
	end    pglogrepl.LSN // > 0: a transaction's end
	lsn    pglogrepl.LSN // a message's position, to name it
	bad    error         // a message with the outbox's prefix that does not decode
	// xid is the writing transaction's id (its low 32 bits, as pgoutput sends it) for a row read
	// from the log; 0 for a row read from the table (a backfill), visible by then.
	xid uint32
	// replayed is an outbox row that carries a last error: a dead letter written again by a
	// replay, which may unpark its key (see dispatcher.check).
	replayed bool
	// start asks the dispatcher to read the keys parked behind dead letters from the table, and,
	// with drain, to read back their rows that may go (see dispatcher.check). Sent first.
	start, drain bool
}

// session is one replication connection's life: set the slot up (backfilling after a lost one),
// stream it and publish until ctx ends or the connection fails.
type session struct {
	r    *Relay
	conn *pgconn.PgConn
	in   chan item
	// failed is closed when the dispatcher fails: the reader stops.
	failed chan struct{}

	sent     atomic.Int64 // items handed to the dispatcher
	flushed  atomic.Int64 // items done, and their rows removed, as of the last flush
	ack      atomic.Uint64
	lastSent pglogrepl.LSN // the position last confirmed to the server

	// The reader's view (its goroutine only).
	idleLSN    pglogrepl.LSN // the server's WAL end when nothing was mid-transaction
	idleAtSent int64         // sent when idleLSN was read
}

func (r *Relay) replicationConfig() *pgconn.Config {
	c := r.cfg.Pool.Config().ConnConfig.Config.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["application_name"] = "outboxkit-log-relay-" + r.fcfg.Name
	// Values reach the relay in text: fix their formats whatever the server's defaults are.
	c.RuntimeParams["DateStyle"] = "ISO"
	c.RuntimeParams["TimeZone"] = "UTC"
	c.RuntimeParams["bytea_output"] = "hex"
	// A read cut short by its deadline leaves the connection usable (the default sends a cancel).
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c
}

func (r *Relay) session(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, r.replicationConfig())
	if err != nil {
		return fmt.Errorf("open the replication connection: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	s := &session{r: r, conn: conn, in: make(chan item, 1024), failed: make(chan struct{})}

	slot, err := r.readSlot(ctx)
	if err != nil {
		return err
	}
	if slot.exists && (slot.plugin != "pgoutput" || slot.slotType != "logical") {
		return fatal("replication slot %s exists but is not a logical pgoutput slot (type %s, plugin %q): it belongs to something else; "+
			"drop it (SELECT pg_drop_replication_slot('%s')) or give the relay another SlotName", r.cfg.SlotName, slot.slotType, slot.plugin, r.cfg.SlotName)
	}
	if slot.exists {
		var db string
		if err := r.cfg.Pool.QueryRow(ctx, r.sql.CurrentDatabase).Scan(&db); err != nil {
			return err
		}
		if slot.database != db {
			return fatal("replication slot %s reads database %s, not %s: give the relay another SlotName", r.cfg.SlotName, slot.database, db)
		}
	}
	cp, err := r.readCheckpoint(ctx)
	if err != nil {
		return err
	}
	if slot.exists && !cp.exists {
		// A slot made by another build or by hand: its position is the relay's starting point.
		if err := r.writeCheckpoint(ctx, slot.confirmed); err != nil {
			return err
		}
		cp = checkpoint{exists: true, mode: string(r.cfg.Mode), confirmed: slot.confirmed}
	}
	if lost := (slot.exists && slot.walStatus == "lost") || (!slot.exists && cp.exists && cp.confirmed != 0); lost && r.cfg.Mode == ModeWAL && !r.cfg.SkipLostEvents {
		r.slotLost.Store(true)
		return fatalError{fmt.Errorf("%w (slot %s, wal_status %q): the events written since cannot be published; "+
			"set SkipLostEvents to make a new slot and go on without them, after recording what was lost", ErrSlotLost, r.cfg.SlotName, slot.walStatus)}
	}
	// What a lost slot leads to: in table mode a backfill; in WAL mode (SkipLostEvents) a new slot
	// without the events the lost one held.
	recovery := "backfilling the outbox rows left in the table, then following the log"
	if r.cfg.Mode == ModeWAL {
		recovery = "SkipLostEvents is set: making a new slot and going on WITHOUT the events the lost one held"
	}
	invalidated := slot.exists && slot.walStatus == "lost"
	if invalidated {
		r.log.Error("Replication slot invalidated (wal_status = lost: it retained more than max_slot_wal_keep_size): "+
			"dropping it; "+recovery, nil, r.fields)
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.SlotName, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			if sqlState(err) == codeObjectInUse {
				return errSlotBusy
			}
			return fmt.Errorf("drop the invalidated slot %s: %w", r.cfg.SlotName, err)
		}
		slot = slotState{}
	}

	// The dispatcher runs from here: a backfill feeds it as the stream does.
	dctx, cancelDispatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDispatch()
	d := newDispatcher(s)
	var wg sync.WaitGroup
	var dispatchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		dispatchErr = d.run(dctx, ctx)
	}()
	finish := func(err error) error {
		close(s.in)
		wg.Wait()
		if dispatchErr != nil && (err == nil || errors.Is(err, errDispatcherFailed)) {
			err = dispatchErr
		}
		if !r.hooks.crash || ctx.Err() == nil {
			s.sendStatus(true)
		}
		return err
	}

	// The keys parked behind a dead letter, read before any event: their later events stay in the
	// table. Without a backfill to read the table, the rows of keys with dead letters that may go
	// (their dead letter replayed or archived while the relay was away, or mid-way when it
	// stopped) are read back too: the slot has moved past them.
	backfilling := !slot.exists || (cp.exists && cp.confirmed == 0)
	never := time.Now().Add(time.Hour)
	if err := s.send(ctx, item{start: true, drain: !backfilling}, &never); err != nil {
		return finish(err)
	}

	switch {
	case !slot.exists:
		if cp.exists && !invalidated {
			r.log.Error("Replication slot missing although the relay has read from it before (dropped by hand, or lost in a failover): "+
				recovery, nil, r.fields)
		}
		if free, max, err := r.freeSlots(ctx); err != nil {
			return finish(fmt.Errorf("count replication slots: %w", err))
		} else if free < 1 {
			return finish(r.noFreeSlot(max))
		}
		if err := r.beginBackfill(ctx); err != nil {
			return finish(err)
		}
		res, err := pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.SlotName, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
		switch {
		case sqlState(err) == codeDuplicateObject:
			return finish(errSlotBusy) // another relay made it first
		case sqlState(err) == codeLimitExceeded:
			_, max, _ := r.freeSlots(ctx)
			return finish(r.noFreeSlot(max))
		case err != nil:
			return finish(fmt.Errorf("create replication slot %s: %w", r.cfg.SlotName, err))
		}
		consistent, err := pglogrepl.ParseLSN(res.ConsistentPoint)
		if err != nil {
			return finish(fmt.Errorf("slot %s: consistent point %q: %w", r.cfg.SlotName, res.ConsistentPoint, err))
		}
		r.log.Info("Replication slot created", r.fields.Add(watermill.LogFields{"consistent_point": res.ConsistentPoint}))
		if err := s.backfill(ctx, res.SnapshotName, consistent); err != nil {
			return finish(err)
		}
	case cp.exists && cp.confirmed == 0:
		// A backfill began and did not finish: the rows it had not published are still in the
		// table (with, perhaps, some the log carries too: published twice, never lost).
		r.log.Info("Finishing a backfill the relay began before it stopped", r.fields)
		if err := s.backfill(ctx, "", slot.confirmed); err != nil {
			return finish(err)
		}
	}

	args := []string{"proto_version '1'", "publication_names '" + r.cfg.PublicationName + "'"}
	if r.cfg.Mode == ModeWAL {
		args = append(args, "messages 'true'")
	}
	// Position 0: the slot's confirmed position, never the server's current one.
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.SlotName, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: args})
	if err != nil {
		if sqlState(err) == codeObjectInUse {
			return finish(errSlotBusy)
		}
		return finish(fmt.Errorf("start reading slot %s: %w", r.cfg.SlotName, err))
	}
	r.setActive(true)
	r.log.Info("Log relay reading the slot", r.fields)
	err = s.read(ctx)
	if ctx.Err() != nil {
		err = nil
	}
	return finish(err)
}

var errDispatcherFailed = errors.New("the dispatcher failed")

// send hands it to the dispatcher, keeping the server informed while the dispatcher is behind.
func (s *session) send(ctx context.Context, it item, nextStatus *time.Time) error {
	for {
		t := time.NewTimer(time.Until(*nextStatus))
		select {
		case s.in <- it:
			t.Stop()
			s.sent.Add(1)
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.failed:
			t.Stop()
			return errDispatcherFailed
		case <-t.C:
			if err := s.sendStatus(false); err != nil {
				return err
			}
			*nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
		}
	}
}

// sendStatus confirms to the server the position below which everything is published: the end of
// the last transaction whose events are all published and removed, or, when the relay had nothing
// in flight as of a keepalive, the server's WAL end at that keepalive (the outbox retains no WAL
// while other tables write).
func (s *session) sendStatus(final bool) error {
	lsn := pglogrepl.LSN(s.ack.Load())
	if s.idleLSN > lsn && s.flushed.Load() >= s.idleAtSent {
		lsn = s.idleLSN
	}
	if lsn < s.lastSent {
		lsn = s.lastSent
	}
	if s.conn.IsClosed() {
		// A failed read closed the connection, and pgconn's goroutine is writing its goodbye on it:
		// writing too would race with that, and would reach no server. The slot keeps the position
		// last confirmed; the next session reads again from there.
		return errors.New("send standby status: the replication connection is closed")
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	s.lastSent = lsn
	_ = final
	return nil
}

// read streams the slot into the dispatcher until ctx ends or the connection fails.
func (s *session) read(ctx context.Context) error {
	interval := s.r.cfg.StatusInterval
	nextStatus := time.Now().Add(interval)
	dec := newDecoder(s.r)
	inTxn := false
	for {
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(false); err != nil {
				return err
			}
			nextStatus = time.Now().Add(interval)
		}
		select {
		case <-s.failed:
			return errDispatcherFailed
		default:
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("read slot %s: the server ended the stream", s.r.cfg.SlotName)
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
				}
				if !inTxn {
					s.idleLSN, s.idleAtSent = ka.ServerWALEnd, s.sent.Load()
				}
				if ka.ReplyRequested {
					nextStatus = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
				}
				m, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("read slot %s: decode pgoutput: %w", s.r.cfg.SlotName, err)
				}
				switch m := m.(type) {
				case *pglogrepl.BeginMessage:
					inTxn = true
					dec.begin(m)
				case *pglogrepl.CommitMessage:
					inTxn = false
					if err := s.send(ctx, item{end: m.TransactionEndLSN}, &nextStatus); err != nil {
						return sendErr(err)
					}
				case *pglogrepl.RelationMessage:
					dec.relations[m.RelationID] = m
				case *pglogrepl.LogicalDecodingMessage:
					it, ok := dec.message(m)
					if ok {
						if err := s.send(ctx, it, &nextStatus); err != nil {
							return sendErr(err)
						}
					}
				case *pglogrepl.InsertMessage:
					it, ok, err := dec.insert(m)
					if err != nil {
						return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
					}
					if ok {
						if err := s.send(ctx, it, &nextStatus); err != nil {
							return sendErr(err)
						}
					}
				}
			}
		}
	}
}

// sendErr is the reader's error when a send did not go through: none when the relay stops.
func sendErr(err error) error {
	if errors.Is(err, errDispatcherFailed) {
		return err
	}
	return nil
}

// decoder turns pgoutput's messages into outbox rows.
type decoder struct {
	r      *Relay
	prefix string
	// A message's Seq is its transaction's commit position shifted left 16 bits plus its index in
	// the transaction: unique and increasing in commit order (commits are at least 24 bytes of WAL
	// apart), and far above any outbox row's seq.
	finalLSN   pglogrepl.LSN
	idx        int64
	relations  map[uint32]*pglogrepl.RelationMessage
	types      *pgtype.Map
	commitTime time.Time
	xid        uint32 // the transaction's id
}

func newDecoder(r *Relay) *decoder {
	return &decoder{r: r, prefix: walmsg.Prefix(r.schema), relations: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}
}

func (d *decoder) begin(m *pglogrepl.BeginMessage) {
	d.commitTime, d.finalLSN, d.idx, d.xid = m.CommitTime, m.FinalLSN, 0, m.Xid
}

// insert decodes an INSERT into the outbox; ok is false for other tables and for rows that are
// not events to publish (dead letters written as such).
func (d *decoder) insert(m *pglogrepl.InsertMessage) (it item, ok bool, err error) {
	rel := d.relations[m.RelationID]
	if rel == nil {
		return it, false, fmt.Errorf("insert into relation %d before its description", m.RelationID)
	}
	if rel.Namespace != d.r.schema || rel.RelationName != "outbox" {
		return it, false, nil
	}
	var uuidText, uuidKey *string
	row := store.OutboxRow{CreatedAt: d.commitTime}
	for i, c := range rel.Columns {
		if i >= len(m.Tuple.Columns) {
			break
		}
		v := m.Tuple.Columns[i]
		if v.DataType == pglogrepl.TupleDataTypeNull {
			continue
		}
		if v.DataType != pglogrepl.TupleDataTypeText {
			return it, false, fmt.Errorf("outbox column %s: unexpected tuple data type %q", c.Name, v.DataType)
		}
		text := string(v.Data)
		switch c.Name {
		case "uuid":
			uuidKey = &text
		case "uuid_text":
			uuidText = &text
		case "seq":
			if row.Seq, err = strconv.ParseInt(text, 10, 64); err != nil {
				return it, false, fmt.Errorf("outbox column seq: %w", err)
			}
		case "topic":
			row.Topic = text
		case "partition_key":
			row.PartitionKey = text
		case "payload":
			if len(text) < 2 || text[:2] != `\x` {
				return it, false, errors.New(`outbox column payload: bytea not in hex format`)
			}
			if row.Payload, err = hex.DecodeString(text[2:]); err != nil {
				return it, false, fmt.Errorf("outbox column payload: %w", err)
			}
		case "metadata":
			row.Metadata = bytes.Clone(v.Data) // v.Data is the connection's buffer, read again
		case "created_at":
			var t time.Time
			if err := d.types.Scan(c.DataType, pgtype.TextFormatCode, v.Data, &t); err != nil {
				return it, false, fmt.Errorf("outbox column created_at: %w", err)
			}
			row.CreatedAt = t
		case "dead_lettered_at", "published_at":
			return it, false, nil // written as a dead letter, or as published: nothing to relay
		case "last_error":
			it.replayed = true
		}
	}
	if uuidKey == nil || row.Topic == "" {
		return it, false, errors.New("an outbox row without uuid or topic: is the outbox at this build's schema version?")
	}
	row.UUID = *uuidKey
	if uuidText != nil {
		row.UUID = *uuidText
	}
	return item{row: row, delKey: *uuidKey, xid: d.xid, replayed: it.replayed}, true, nil
}

// message decodes a logical decoding message: ok is false for other prefixes. One with the
// outbox's prefix that does not decode is handed on as such, to be dead-lettered.
func (d *decoder) message(m *pglogrepl.LogicalDecodingMessage) (it item, ok bool) {
	if m.Prefix != d.prefix || d.r.cfg.Mode != ModeWAL {
		return it, false
	}
	d.idx++
	seq := int64(d.finalLSN)<<16 + d.idx
	content := bytes.Clone(m.Content) // m.Content is the connection's buffer, read again
	e, err := walmsg.Decode(content)
	if err != nil {
		return item{row: store.OutboxRow{Seq: seq, Payload: content, CreatedAt: d.commitTime}, bad: err, lsn: m.LSN}, true
	}
	return item{row: store.OutboxRow{Seq: seq, UUID: e.UUID, Topic: e.Topic, PartitionKey: e.PartitionKey,
		Payload: e.Payload, Metadata: e.Metadata, CreatedAt: d.commitTime}, lsn: m.LSN}, true
}

// backfill publishes the outbox rows left in the table — the events the relay may not have
// published — before the log is followed: with snapshot, as the table stood when the slot was
// made (the log carries every later commit); without, as it stands (a later commit may then be
// published twice). It ends with the slot's position, which confirms the backfill.
func (s *session) backfill(ctx context.Context, snapshot string, at pglogrepl.LSN) error {
	r := s.r
	tx, err := r.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("backfill: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	if snapshot != "" {
		if _, err := tx.Exec(ctx, r.sql.SetSnapshot(snapshot)); err != nil {
			return fmt.Errorf("backfill: take the slot's snapshot: %w", err)
		}
	}
	nextStatus := time.Now().Add(time.Hour) // not streaming yet: no status to send
	var after int64
	n := 0
	for {
		rows, err := tx.Query(ctx, r.sql.Backfill, after, backfillBatch)
		if err != nil {
			return fmt.Errorf("backfill: read the outbox: %w", err)
		}
		var batch []item
		for rows.Next() {
			it, err := scanRow(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("backfill: read the outbox: %w", err)
			}
			batch = append(batch, it)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("backfill: read the outbox: %w", err)
		}
		for _, it := range batch {
			if err := s.send(ctx, it, &nextStatus); err != nil {
				return err
			}
		}
		n += len(batch)
		if len(batch) < backfillBatch {
			break
		}
		after = batch[len(batch)-1].row.Seq
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("backfill: end the snapshot: %w", err)
	}
	if at == 0 {
		at = 1 // a backfill without a known position still has to record its end
	}
	if err := s.send(ctx, item{end: at}, &nextStatus); err != nil {
		return err
	}
	r.log.Info("Backfill read the outbox rows left in the table", r.fields.Add(watermill.LogFields{"rows": n}))
	return nil
}

// backfillBatch is how many rows of the table a backfill reads at a time.
const backfillBatch = 1000

// scanRow reads one outbox row selected with the columns of the statements that read events back
// (internal/pgsql's event_columns.sql) into an item, as the log would carry it.
func scanRow(rows pgx.Rows) (item, error) {
	var (
		it       item
		uuidText *string
		metadata string
	)
	if err := rows.Scan(&it.delKey, &uuidText, &it.row.Seq, &it.row.Topic, &it.row.PartitionKey, &it.row.Payload, &metadata, &it.row.CreatedAt); err != nil {
		return item{}, err
	}
	it.row.Metadata = []byte(metadata)
	it.row.UUID = it.delKey
	if uuidText != nil {
		it.row.UUID = *uuidText
	}
	return it, nil
}
