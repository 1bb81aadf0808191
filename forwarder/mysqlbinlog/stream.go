package mysqlbinlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/store"
)

// item is what the reader hands the dispatcher, in commit order: a row to publish, or the end of
// the transaction that committed the rows before it, or the end of the first start's reading of
// the table.
type item struct {
	row store.OutboxRow
	// nextAt is a row's next attempt as recorded in the outbox (it backs off since an earlier
	// run); zero for none.
	nextAt time.Time
	// fromTable is a row read from the table, not the log: it belongs to no transaction of the
	// log, and its removal waits for none.
	fromTable bool

	// end is a transaction's end: the position after it, and the GTID it adds to the set read
	// (gtid: "" for none, as where progress is tracked by file).
	end  bool
	gtid string
	file string
	pos  uint32
	// quiet is the end of a transaction that wrote a checkpoint (a relay's own write): passing
	// it alone is no progress worth a checkpoint of its own.
	quiet bool

	// tableDone is the end of the first start's reading of the table.
	tableDone bool
}

// syncerConfig is how the relay asks the server for its binary log.
func (s *session) syncerConfig() replication.BinlogSyncerConfig {
	r := s.r
	host, portText, _ := net.SplitHostPort(r.addr)
	port, _ := strconv.Atoi(portText)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return replication.BinlogSyncerConfig{
		ServerID:        r.serverID,
		Flavor:          s.settings.flavor,
		Host:            host,
		Port:            uint16(port),
		User:            r.user,
		Password:        r.password,
		Localhost:       r.host,
		HeartbeatPeriod: r.cfg.Heartbeat,
		ReadTimeout:     3 * r.cfg.Heartbeat,
		// The relay reads again from its checkpoint itself (session), never from where a
		// broken stream left off.
		DisableRetrySync: true,
		// A DATETIME as MySQL writes it, read in UTC (decode.go).
		ParseTime:       false,
		Dialer:          dialer.DialContext,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		EventCacheCount: 256,
		// MariaDB 11.4 and later leave some events' positions at 0: go-mysql works them out.
		FillZeroLogPos: s.settings.flavor == flavorMariaDB && !s.gtid,
		// Only the outbox's rows are decoded; of other tables' row events the header is enough.
		RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error {
			pos, err := e.DecodeHeader(data)
			if err != nil || !r.isOutbox(e.Table) {
				return err
			}
			return e.DecodeData(pos, data)
		},
	}
}

// readLog streams the binary log from s.from, handing the outbox's rows and every transaction's
// end to the dispatcher, until ctx ends or the stream fails.
func (s *session) readLog(ctx context.Context) error {
	r := s.r
	syncer := replication.NewBinlogSyncer(s.syncerConfig())
	defer syncer.Close()
	var (
		streamer *replication.BinlogStreamer
		err      error
	)
	if r.hooks.refuseLog {
		return logGoneError{from: s.from, err: errors.New("the test refuses the binary log")}
	}
	if s.gtid {
		set, perr := s.from.gtidSet(s.settings.flavor)
		if perr != nil {
			return fatal("the checkpoint's %w", perr)
		}
		streamer, err = syncer.StartSyncGTID(set)
	} else {
		streamer, err = syncer.StartSync(s.from.filePos())
	}
	if err != nil {
		return s.streamError(err)
	}
	r.setActive(true)
	r.log.Info("Binlog relay reading the binary log", r.fields.Add(watermill.LogFields{"from": s.from.String()}))

	t := txnReader{s: s, file: s.from.file}
	for ctx.Err() == nil { // checked first: GetEvent may take a buffered event over ctx's end
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return s.streamError(err)
		}
		if err := t.handle(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// streamError says what a failure of the stream means: a missing privilege is fatal; a position
// the server cannot send the log from is recovered from the table (recoverFromTable); anything
// else is read again from the checkpoint.
func (s *session) streamError(err error) error {
	switch errorNumber(err) {
	case errAccessDenied, errUserAccessDenied:
		// (1045 is also a wrong password; but the same user's password opened the relay's other
		// connections.)
		return s.r.deniedReading(s.settings, err)
	case errMasterFatalReadingLog:
		return logGoneError{from: s.from, err: err}
	}
	return fmt.Errorf("read the binary log: %w", err)
}

// txnReader follows the events of the log, one transaction at a time: a transaction's outbox
// rows are handed on with its end, and dropped if it rolls back.
type txnReader struct {
	s     *session
	file  string // the binary log file being read
	open  bool   // in a transaction (BEGIN read), whose statements are not transactions alone
	rows  []item // the open transaction's outbox rows
	gtid  string // the open transaction's GTID
	quiet bool   // the open transaction writes a checkpoint
}

func (t *txnReader) begin() { t.open, t.rows, t.gtid, t.quiet = false, t.rows[:0], "", false }

func (t *txnReader) handle(ctx context.Context, ev *replication.BinlogEvent) error {
	s := t.s
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		t.file = string(e.NextLogName)
	case *replication.GTIDEvent: // MySQL: a transaction, or a statement alone, begins
		t.begin()
		sid, err := uuid.FromBytes(e.SID)
		if err != nil {
			return fmt.Errorf("a GTID event's server uuid: %w", err)
		}
		t.gtid = sid.String() + ":" + strconv.FormatInt(e.GNO, 10)
	case *replication.MariadbGTIDEvent: // MariaDB: a transaction ("BEGIN GTID"), or a statement alone, begins
		t.begin()
		t.gtid, t.open = e.GTID.String(), !e.IsStandalone()
	case *replication.TransactionPayloadEvent: // MySQL's binlog_transaction_compression
		for _, inner := range e.Events {
			if _, isXID := inner.Event.(*replication.XIDEvent); isXID {
				continue // its end is the payload's own, below
			}
			if err := t.handle(ctx, inner); err != nil {
				return err
			}
		}
		return t.end(ctx, ev.Header.LogPos)
	case *replication.RowsEvent:
		return t.rowsEvent(ctx, e)
	case *replication.XIDEvent:
		return t.end(ctx, ev.Header.LogPos)
	case *replication.QueryEvent:
		switch strings.ToUpper(strings.TrimSpace(string(e.Query))) {
		case "BEGIN":
			if !t.open { // MySQL's transactions begin so, after their GTID event, if any
				t.open = true
				t.rows, t.quiet = t.rows[:0], false
			}
		case "COMMIT":
			return t.end(ctx, ev.Header.LogPos) // a transaction on a table without XA (MyISAM, say)
		case "ROLLBACK":
			t.begin() // a transaction that wrote a table without XA and rolled back
		default:
			if err := s.r.statementWrite(e); err != nil {
				return err
			}
			if !t.open {
				return t.end(ctx, ev.Header.LogPos) // a statement alone (DDL)
			}
		}
	}
	return nil
}

// statementWrite refuses an outbox row written to the log as a statement (binlog_format
// STATEMENT or MIXED in the writer's session): the relay would never see its row.
func (r *Relay) statementWrite(e *replication.QueryEvent) error {
	q := strings.ToLower(skipComments(string(e.Query)))
	if !strings.HasPrefix(q, "insert") && !strings.HasPrefix(q, "replace") {
		return nil
	}
	if !strings.Contains(q, "outbox") || (string(e.Schema) != r.database && !strings.Contains(q, strings.ToLower(r.database))) {
		return nil
	}
	return fatal("an outbox row was written to the binary log as a statement, not as a row event (a writer's session "+
		"runs binlog_format = STATEMENT or MIXED): the relay cannot read its row. SET GLOBAL binlog_format = 'ROW', set it in "+
		"the option file, and let the writers reconnect; the row stays in the outbox, unpublished, until a relay reads it "+
		"(the polling relay does): %.200s", e.Query)
}

// skipComments drops the comments and spaces a statement begins with (outboxkit's own statements
// begin with their documentation).
func skipComments(q string) string {
	for {
		q = strings.TrimSpace(q)
		switch {
		case strings.HasPrefix(q, "--") || strings.HasPrefix(q, "#"):
			_, rest, ok := strings.Cut(q, "\n")
			if !ok {
				return ""
			}
			q = rest
		case strings.HasPrefix(q, "/*"):
			_, rest, ok := strings.Cut(q, "*/")
			if !ok {
				return ""
			}
			q = rest
		default:
			return q
		}
	}
}

// rowsEvent takes the outbox's new rows from an insert, and a replayed dead letter from an
// update (dead_lettered_at set before, cleared after): the dead letter goes out again.
func (t *txnReader) rowsEvent(ctx context.Context, e *replication.RowsEvent) error {
	if e.Table != nil && string(e.Table.Table) == "binlog_relays" {
		t.quiet = true
		return nil
	}
	s := t.s
	if !s.r.isOutbox(e.Table) {
		return nil
	}
	m, err := s.columnsFor(ctx, e.Table)
	if err != nil {
		return err
	}
	switch e.Type() {
	case replication.EnumRowsEventTypeInsert:
		for _, image := range e.Rows {
			o, err := decodeImage(m, image, e.ColumnBitmap1)
			if err != nil {
				return asFatal(err)
			}
			if o.published || o.deadLettered {
				continue // written as done (a restore, a copy): not the relay's
			}
			t.add(o)
		}
	case replication.EnumRowsEventTypeUpdate:
		for i := 0; i+1 < len(e.Rows); i += 2 {
			before, err := decodeImage(m, e.Rows[i], e.ColumnBitmap1)
			if err != nil {
				return asFatal(err)
			}
			after, err := decodeImage(m, e.Rows[i+1], e.ColumnBitmap2)
			if err != nil {
				return asFatal(err)
			}
			if before.deadLettered && !after.deadLettered && !after.published {
				t.add(after)
			}
		}
	}
	return nil
}

func asFatal(err error) error {
	var mc errMissingColumn
	if errors.As(err, &mc) {
		return fatalError{err}
	}
	return fmt.Errorf("decode an outbox row event: %w", err)
}

func (t *txnReader) add(o outboxRow) {
	it := item{row: o.row}
	if b, ok := t.s.backingOff[o.row.Seq]; ok {
		// It backs off since an earlier run: resume its count, and its wait.
		it.row.Attempts, it.nextAt = max(it.row.Attempts, b.attempts), b.nextAt
		delete(t.s.backingOff, o.row.Seq)
	}
	t.rows = append(t.rows, it)
}

// end hands on the open transaction's rows and its end, at pos of the file being read: all of
// them, whether ctx ends meanwhile or not, so that a transaction whose rows were published is
// passed by the last checkpoint (the dispatcher takes in what is handed over until the reader
// stops, see dispatcher.run).
func (t *txnReader) end(_ context.Context, pos uint32) error {
	for _, it := range t.rows {
		t.s.in <- it
	}
	t.s.in <- item{end: true, gtid: t.gtid, file: t.file, pos: pos, quiet: t.quiet}
	t.begin()
	return nil
}
