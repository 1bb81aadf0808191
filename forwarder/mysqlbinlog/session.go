package mysqlbinlog

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/outboxkit/outboxkit/forwarder"
)

// session is one reading of the binary log: take the group's lock, find where to read from, read
// (the table first, on a group's first start) and publish until ctx ends or something fails.
type session struct {
	r        *Relay
	fwd      *forwarder.SourceRelay
	db       *sql.DB
	conn     *sql.Conn  // holds the group's lock, and writes the checkpoints
	lock     *groupLock // conn once the session publishes: its uses, and the lock's watchdog
	settings settings
	gtid     bool     // progress tracked by GTIDs
	from     position // where the log is read from: the checkpoint
	// backfilled is false until the first start's reading of the table (or a recovery's, see
	// recoverFromTable) has published every row it found: a session that starts with it false
	// reads the table first.
	backfilled bool
	in         chan item

	// The reader's (its goroutine only, once it runs).
	backingOff map[int64]attempt // rows whose failed attempts are recorded, by seq
	columns    map[int]columnMap // by the count of columns of the events they map
}

// attempt is a failed attempt recorded in the outbox.
type attempt struct {
	attempts int
	nextAt   time.Time
}

func (r *Relay) session(ctx context.Context, db *sql.DB, st settings, sr *forwarder.SourceRelay) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		// Never back to the pool: closing the connection releases the group's lock, whatever
		// state it is in.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	if err := r.takeLock(ctx, conn); err != nil || ctx.Err() != nil {
		return err
	}
	if checked, err := r.checkReplicas(ctx, db, st); err != nil {
		return err
	} else if !checked && !r.replicasUnchecked.Swap(true) {
		r.log.Info("Cannot list the server's replicas (SHOW SLAVE HOSTS needs REPLICATION MASTER ADMIN on MariaDB): "+
			"the relay's ServerID is not checked against theirs", r.fields)
	}

	s := &session{r: r, fwd: sr, db: db, conn: conn, settings: st, gtid: st.useGTID(r.cfg.FilePosition),
		in: make(chan item, 1024)}
	if err := s.start(ctx); err != nil {
		return err
	}

	// From here on the session publishes: ctx, from here on, also ends once the lock's watchdog
	// finds the lock lost.
	ctx, stopWatching, err := s.watchLock(ctx)
	defer stopWatching()
	if err != nil {
		return err
	}
	// The reader feeds the dispatcher; it stops with rctx, which ends with ctx or when the
	// dispatcher fails.
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	var (
		wg      sync.WaitGroup
		readErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(s.in)
		readErr = s.read(rctx)
	}()
	d, err := newDispatcher(s)
	if err == nil {
		err = d.run(ctx)
	}
	stopReading()
	for range s.in { // let the reader finish
	}
	wg.Wait()
	if readErr != nil && ctx.Err() == nil && (err == nil || errors.Is(err, errReaderStopped)) {
		err = readErr
	}
	if gone := (logGoneError{}); errors.As(err, &gone) && ctx.Err() == nil {
		return s.recoverFromTable(ctx, gone)
	}
	return err
}

// start finds where the session reads from: the group's checkpoint, or on its first start the
// binary log's end now — recorded at once, before the table is read, so that a relay starting
// again reads the log from there too.
func (s *session) start(ctx context.Context) error {
	r := s.r
	cp, err := r.readCheckpoint(ctx, s.conn)
	if err != nil {
		return err
	}
	progress := s.progress()
	switch {
	case !cp.exists:
		p, err := r.currentPosition(ctx, s.db, s.settings, s.gtid)
		if err != nil {
			return err
		}
		if err := r.writeCheckpoint(ctx, s.conn, s.settings, progress, p, false); err != nil {
			return err
		}
		s.from = p
		r.log.Info("Binlog relay group starting for the first time: reading the rows waiting in the outbox, then the binary log from its end",
			r.fields.Add(watermill.LogFields{"from": p.String()}))
	case cp.flavor != s.settings.flavor:
		return fatal("the relay group's checkpoint was recorded on a %s server, and this one is %s: "+
			"give the relay another Name, or delete the checkpoint row (DELETE FROM `%s`.binlog_relays WHERE name = '%s') once the outbox is empty",
			cp.flavor, s.settings.flavor, r.database, r.fcfg.Name)
	case cp.progress != progress:
		return fatal("the relay group's checkpoint tracks its progress by %s, and the relay is set to track it by %s: "+
			"set Config.FilePosition back (%v), or delete the checkpoint row (DELETE FROM `%s`.binlog_relays WHERE name = '%s') once the outbox is empty",
			cp.progress, progress, cp.progress == "file", r.database, r.fcfg.Name)
	default:
		s.from, s.backfilled = cp.pos, cp.backfilled
	}
	names, err := r.readColumns(ctx, s.db)
	if err != nil {
		return err
	}
	m, err := mapColumns(names)
	if err != nil {
		return fatalError{err}
	}
	s.columns = map[int]columnMap{m.count: m}
	s.backingOff, err = r.readBackingOff(ctx, s.db)
	return err
}

// read reads the table first, when the first start's reading of it is not done, then the log.
func (s *session) read(ctx context.Context) error {
	if !s.backfilled {
		if err := s.readTable(ctx); err != nil {
			return err
		}
		if err := s.send(ctx, item{tableDone: true}); err != nil {
			return err
		}
	}
	return s.readLog(ctx)
}

// errReaderStopped is the dispatcher finding the reader gone: the reader's error says why.
var errReaderStopped = errors.New("the binary log's reader stopped")

// send hands it to the dispatcher.
func (s *session) send(ctx context.Context, it item) error {
	select {
	case s.in <- it:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// columnsFor is where the outbox's columns are in the row images of t: by the names the event
// carries (binlog_row_metadata = FULL), else in the table's order as the catalog says, read again
// when an event has another count of columns than the ones seen (an ALTER TABLE since).
func (s *session) columnsFor(ctx context.Context, t *replication.TableMapEvent) (columnMap, error) {
	if names := t.ColumnNameString(); len(names) == int(t.ColumnCount) && len(names) > 0 {
		m, err := mapColumns(names)
		if err != nil {
			return m, fatalError{err}
		}
		return m, nil
	}
	n := int(t.ColumnCount)
	if m, ok := s.columns[n]; ok {
		return m, nil
	}
	names, err := s.r.readColumns(ctx, s.db)
	if err != nil {
		return columnMap{}, err
	}
	m, err := mapColumns(names)
	if err != nil {
		return m, fatalError{err}
	}
	if n == m.count || (n < m.count && maxIndex(m) < n) {
		// n < m.count: an event from before columns were added at the end (as outboxkit's
		// migrations add them); the columns the relay reads are where they were.
		s.columns[n] = m
		return m, nil
	}
	return m, fatal("an outbox row event has %d columns and the outbox %d, not in a way the relay can map "+
		"(columns dropped or moved since the event was written): set binlog_row_metadata = FULL, whose events "+
		"carry their columns' names, and start the relay again", n, m.count)
}

func maxIndex(m columnMap) int {
	hi := 0
	for _, c := range rowColumns {
		hi = max(hi, m.at[c])
	}
	return hi
}
