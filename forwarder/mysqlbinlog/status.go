package mysqlbinlog

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// Server error numbers the status tells apart.
const (
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errNoBinaryLogging = 1381 // ER_NO_BINARY_LOGGING: log_bin is off
)

// lockName is the name of a relay group's lock (GET_LOCK), held by the relay of the group that
// reads the binary log: from the outbox's database and the group's Name.
func lockName(database, name string) string {
	n := "outboxkit.binlog." + database + "." + name
	if len(n) > 64 {
		// GET_LOCK names are at most 64 characters: keep a start, and a hash of the whole so
		// that names stay apart.
		sum := sha256.Sum256([]byte(n))
		n = n[:40] + "." + hex.EncodeToString(sum[:11])
	}
	return n
}

// ReadStatus reads every binlog relay group that has recorded a checkpoint in the outbox's
// database — for an operator's tool (outboxctl status) that runs no relay: its checkpoint and
// the checkpoint's age, whether a relay of it holds the group's lock, whether an operator pauses
// it, and how far behind the server's binary log it is. None when no binlog relay has run there.
//
// The lag and the purge come from SHOW BINARY LOGS, which needs BINLOG MONITOR (REPLICATION
// CLIENT on MySQL): without it each group's LagBytes is -1 and its LogError says which GRANT
// gives it, and ReadStatus returns no error for it. Three statements, four where the user may not
// list the binary logs.
func ReadStatus(ctx context.Context, db *sql.DB, database string) ([]forwarder.BinlogStatus, error) {
	return readStatus(ctx, db, database, newStatements(database).status, nil)
}

// Status reads the relay's group as ReadStatus does (prom.NewBinlogCollector exports it at each
// scrape), whether or not Run runs in this process: Active says whether any relay of the group
// holds its lock. Before the group's first start recorded a checkpoint, it has only Active, and
// LagBytes -1. It opens one connection to Config.URL for the call, and closes it.
func (r *Relay) Status(ctx context.Context) (forwarder.BinlogStatus, error) {
	dsn, err := mysqlstore.DSN(r.cfg.URL)
	if err != nil {
		return forwarder.BinlogStatus{}, err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return forwarder.BinlogStatus{}, fmt.Errorf("binlog relay %s: read its status: %w", r.fcfg.Name, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	name := r.fcfg.Name
	out, err := readStatus(ctx, db, r.database, r.sql.status, &name)
	if err != nil || len(out) > 0 {
		if err != nil {
			return forwarder.BinlogStatus{}, fmt.Errorf("binlog relay %s: %w", name, err)
		}
		return out[0], nil
	}
	s := forwarder.BinlogStatus{Relay: name, Database: r.database, LagBytes: -1}
	active, err := locksHeld(ctx, db, []string{r.lockName})
	if err != nil {
		return s, fmt.Errorf("binlog relay %s: %w", name, err)
	}
	s.Active = active[0]
	return s, nil
}

// readStatus reads the relay groups of the outbox's binlog_relays with q (the status statement
// rendered for its database): name one group, or nil for all.
func readStatus(ctx context.Context, db *sql.DB, database, q string, name *string) ([]forwarder.BinlogStatus, error) {
	out, err := readCheckpoints(ctx, db, database, q, name)
	if err != nil || len(out) == 0 {
		return nil, err
	}
	locks := make([]string, len(out))
	for i, s := range out {
		locks[i] = lockName(database, s.Relay)
	}
	active, err := locksHeld(ctx, db, locks)
	if err != nil {
		return nil, err
	}
	logs, logErr, err := binaryLogs(ctx, db)
	if err != nil {
		return nil, err
	}
	for i := range out {
		s := &out[i]
		s.Active, s.LogError = active[i], logErr
		if logErr == "" {
			s.LagBytes, s.Purged = lagSince(logs, s.File, s.Pos)
		}
	}
	return out, nil
}

// readCheckpoints reads the relay groups' checkpoints. A database where no binlog relay has run
// has no binlog_relays table: none.
func readCheckpoints(ctx context.Context, db *sql.DB, database, q string, name *string) ([]forwarder.BinlogStatus, error) {
	rows, err := db.QueryContext(ctx, q, name, name)
	if errorNumber(err) == errNoSuchTable {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'binlog_relays'",
			database).Scan(&n); err == nil && n == 0 {
			return nil, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the binlog relays' checkpoints in %s.binlog_relays: %w", database, err)
	}
	defer rows.Close()
	var out []forwarder.BinlogStatus
	for rows.Next() {
		var (
			s         = forwarder.BinlogStatus{Database: database, LagBytes: -1}
			gtid, at  string
			ageMicros int64
			paused    int
		)
		if err := rows.Scan(&s.Relay, &s.Progress, &gtid, &s.File, &s.Pos, &at, &ageMicros, &paused); err != nil {
			return nil, fmt.Errorf("read the binlog relays' checkpoints: %w", err)
		}
		if s.CheckpointAt, err = time.ParseInLocation(layout, at, time.UTC); err != nil {
			return nil, fmt.Errorf("read the binlog relays' checkpoints: updated_at %q: %w", at, err)
		}
		s.CheckpointAge, s.Paused = time.Duration(ageMicros)*time.Microsecond, paused == 1
		s.Position = gtid
		if s.Progress != "gtid" {
			s.Position = s.File + ":" + strconv.FormatUint(s.Pos, 10)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the binlog relays' checkpoints: %w", err)
	}
	return out, nil
}

// locksHeld reports, for each lock name, whether a connection holds it (IS_USED_LOCK). One
// statement.
func locksHeld(ctx context.Context, db *sql.DB, names []string) ([]bool, error) {
	cols := make([]string, len(names))
	args := make([]any, len(names))
	for i, n := range names {
		cols[i], args[i] = "IS_USED_LOCK(?) IS NOT NULL", n
	}
	held := make([]int, len(names))
	ptrs := make([]any, len(names))
	for i := range held {
		ptrs[i] = &held[i]
	}
	if err := db.QueryRowContext(ctx, "SELECT "+strings.Join(cols, ", "), args...).Scan(ptrs...); err != nil {
		return nil, fmt.Errorf("read whether a relay holds the relay groups' locks: %w", err)
	}
	out := make([]bool, len(held))
	for i, h := range held {
		out[i] = h == 1
	}
	return out, nil
}

// binaryLog is one of the server's binary log files, as SHOW BINARY LOGS lists it.
type binaryLog struct {
	name string
	size int64
}

// binaryLogs lists the server's binary log files, oldest first. A server that will not list
// them to this user, or has the binary log off, gives logErr, which says why and what to do;
// err is any other failure.
func binaryLogs(ctx context.Context, db *sql.DB) (logs []binaryLog, logErr string, err error) {
	rows, err := db.QueryContext(ctx, "SHOW BINARY LOGS")
	switch errorNumber(err) {
	case errAccessDenied:
		var user, version string
		if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER(), VERSION()").Scan(&user, &version); err != nil {
			return nil, "", fmt.Errorf("list the server's binary logs: %w", err)
		}
		s := settings{user: user}
		grant := "GRANT REPLICATION CLIENT"
		if strings.Contains(strings.ToLower(version), "mariadb") {
			grant = "GRANT BINLOG MONITOR"
		}
		return nil, fmt.Sprintf("user %s may not list the binary logs (%v), so the lag and the purge are unknown: %s ON *.* TO %s",
			s.account(), err, grant, s.account()), nil
	case errNoBinaryLogging:
		return nil, fmt.Sprintf("the server's binary log is off (%v): no binlog relay can read it", err), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("list the server's binary logs: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, "", fmt.Errorf("list the server's binary logs: %w", err)
	}
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, "", fmt.Errorf("list the server's binary logs: %w", err)
		}
		var l binaryLog
		for i, c := range cols {
			switch strings.ToLower(c) {
			case "log_name":
				l.name = string(vals[i])
			case "file_size":
				if l.size, err = strconv.ParseInt(string(vals[i]), 10, 64); err != nil {
					return nil, "", fmt.Errorf("list the server's binary logs: file size %q: %w", vals[i], err)
				}
			}
		}
		logs = append(logs, l)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list the server's binary logs: %w", err)
	}
	return logs, "", nil
}

// lagSince is the binary log written since file:pos — the rest of file and every later one — or
// purged when file is no longer among logs. A checkpoint that names no file has an unknown lag.
func lagSince(logs []binaryLog, file string, pos uint64) (lag int64, purged bool) {
	if file == "" {
		return -1, false
	}
	for i, l := range logs {
		if l.name != file {
			continue
		}
		lag = max(l.size-int64(pos), 0)
		for _, later := range logs[i+1:] {
			lag += later.size
		}
		return lag, false
	}
	return -1, true
}
