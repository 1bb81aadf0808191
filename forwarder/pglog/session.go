package pglog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/outboxkit/outboxkit/forwarder"
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
	// commit is the writing transaction's commit position for a row read from the log; 0 for a
	// row read from the table.
	commit pglogrepl.LSN
	// replayed is an outbox row that carries a last error: a dead letter written again by a
	// replay, which may unpark its key (see dispatcher.check).
	replayed bool
	// start asks the dispatcher to read the keys parked behind dead letters from the table, and,
	// with drain, to read back their rows that may go (see dispatcher.check). Sent first.
	start, drain bool
	// recovery is, with a transactional publisher, what the session read when it took the relay
	// group over: no row goes before it (txn.go).
	recovery *txnRecovery
}

// session is one replication connection's life: set the slot up (backfilling after a lost one),
// stream it and publish until ctx ends or the connection fails.
type session struct {
	r    *Relay
	fwd  *forwarder.SourceRelay // the forwarder's publish path and pauses
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

func (r *Relay) session(ctx context.Context, fwd *forwarder.SourceRelay) error {
	conn, err := pgconn.ConnectConfig(ctx, r.replicationConfig())
	if err != nil {
		return fmt.Errorf("open the replication connection: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	s := &session{r: r, fwd: fwd, conn: conn, in: make(chan item, 1024), failed: make(chan struct{})}

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
			// Best effort: when it fails (the connection is gone) the slot keeps the position last
			// confirmed, and the next session reads again from there.
			_ = s.sendStatus()
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

	// With a transactional publisher the session takes the relay group over (txn.go) once it may
	// publish — after it made the slot or started reading it, so that a standby waiting for the
	// slot does not fence the relay reading it — and before any row goes.
	pub := fwd.Transactions()
	recovered := false
	takeOver := func(belowFromTable bool) error {
		if pub == nil || recovered {
			return nil
		}
		recovered = true
		return s.recoverTxn(ctx, pub, belowFromTable)
	}
	remade := false
	if pub != nil && slot.exists && cp.exists && cp.confirmed == 0 && r.cfg.Mode == ModeTable {
		// A backfill began and did not finish. Read without the slot's snapshot, the table as it
		// stands holds rows the log carries too, and a row removed after the backfill published it
		// would come again from the log: make the slot again, with a snapshot, as after a lost one.
		// In table mode the rows left in the outbox are every event not yet handled.
		if err := takeOver(false); err != nil {
			return finish(err)
		}
		r.log.Info("Making the slot again to finish a backfill the relay began before it stopped", r.fields)
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.SlotName, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			if sqlState(err) == codeObjectInUse {
				return finish(errSlotBusy)
			}
			return finish(fmt.Errorf("drop slot %s to make it again: %w", r.cfg.SlotName, err))
		}
		slot, remade = slotState{}, true
	}

	switch {
	case !slot.exists:
		if cp.exists && !invalidated && !remade {
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
		if err := takeOver(false); err != nil { // the slot's position is new: log_relays says nothing of it
			return finish(err)
		}
		if err := s.backfill(ctx, res.SnapshotName, consistent); err != nil {
			return finish(err)
		}
	case cp.exists && cp.confirmed == 0:
		// A backfill began and did not finish: the rows it had not published are still in the
		// table (with, perhaps, some the log carries too: published twice, never lost).
		r.log.Info("Finishing a backfill the relay began before it stopped", r.fields)
		if err := takeOver(false); err != nil {
			return finish(err)
		}
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
	if err := takeOver(true); err != nil {
		return finish(err)
	}
	r.setActive(true)
	r.log.Info("Log relay reading the slot", r.fields)
	err = s.read(ctx)
	if ctx.Err() != nil {
		err = nil
	}
	return finish(err)
}
