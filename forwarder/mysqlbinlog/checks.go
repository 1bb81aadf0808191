package mysqlbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	sqlmysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/store"
)

// Server error numbers the relay tells apart.
const (
	errAccessDenied          = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR: a privilege is missing
	errUserAccessDenied      = 1045 // ER_ACCESS_DENIED_ERROR: MariaDB's answer to a replica without REPLICATION SLAVE
	errTableAccessDenied     = 1142 // ER_TABLEACCESS_DENIED_ERROR
	errDBAccessDenied        = 1044 // ER_DBACCESS_DENIED_ERROR
	errSyntax                = 1064 // ER_PARSE_ERROR: a statement this server does not know
	errMasterFatalReadingLog = 1236 // ER_MASTER_FATAL_ERROR_READING_BINLOG: the position is not in the log
)

// errorNumber is the server's error number in err, from either client (database/sql's driver,
// or go-mysql's replication connection); 0 for none. The relay reads the driver's errors itself,
// below the store seam on purpose: it is MySQL's own log reader, on connections of its own (the
// replication stream, the lock, the checks), whose errors — 1236 above all — the store's
// classification has no word for.
func errorNumber(err error) int {
	var se *sqlmysql.MySQLError
	if errors.As(err, &se) {
		return int(se.Number)
	}
	var me *gomysql.MyError
	if errors.As(err, &me) {
		return int(me.Code)
	}
	return 0
}

// settings is what the relay needs to know of the server, read at start.
type settings struct {
	logBin   bool
	format   string // binlog_format
	rowImage string // binlog_row_image
	serverID uint32 // the server's own server_id
	version  string
	user     string // CURRENT_USER(), user@host
	flavor   string // flavorMariaDB or flavorMySQL
	gtidMode string // MySQL's gtid_mode; "" on MariaDB, which always writes GTIDs
}

// account is the user as a GRANT names it: 'user'@'host'.
func (s settings) account() string {
	u, h, ok := strings.Cut(s.user, "@")
	if !ok {
		return "'" + s.user + "'"
	}
	return "'" + u + "'@'" + h + "'"
}

// useGTID reports whether the relay tracks its progress by GTIDs on this server.
func (s settings) useGTID(filePosition bool) bool {
	if filePosition {
		return false
	}
	return s.flavor == flavorMariaDB || strings.EqualFold(s.gtidMode, "ON")
}

func (r *Relay) readSettings(ctx context.Context, db *sql.DB) (settings, error) {
	var (
		s      settings
		logBin int
	)
	err := db.QueryRowContext(ctx, r.sql.serverSettings).Scan(&logBin, &s.format, &s.rowImage, &s.serverID, &s.version, &s.user)
	if err != nil {
		return s, fmt.Errorf("read the server's settings: %w", err)
	}
	s.logBin = logBin == 1
	s.flavor = flavorMySQL
	if strings.Contains(strings.ToLower(s.version), "mariadb") {
		s.flavor = flavorMariaDB
	} else if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&s.gtidMode); err != nil {
		return s, fmt.Errorf("read the server's gtid_mode: %w", err)
	}
	return s, nil
}

// checkSettings refuses a server whose binary log cannot carry the outbox's rows to the relay,
// each refusal with what to do about it.
func checkSettings(s settings, serverID uint32) error {
	if !s.logBin {
		return errors.New("the server's binary log is off (log_bin = OFF), and the relay reads the outbox from it: " +
			"start the server with the binary log on (in its option file: log_bin = mysql-bin, server_id = 1, " +
			"binlog_format = ROW; MySQL 8 has it on by default; on Amazon RDS keep automated backups on, on Cloud SQL " +
			"enable point-in-time recovery) and restart it — or use the polling relay (forwarder.Run)")
	}
	if !strings.EqualFold(s.format, "ROW") {
		return fmt.Errorf("the server writes the binary log with binlog_format = %s, and the relay reads the outbox's rows "+
			"from row events: SET GLOBAL binlog_format = 'ROW', and set binlog_format = ROW in the option file so that a "+
			"restart keeps it (sessions opened before keep their format: let the writers reconnect)", s.format)
	}
	if !strings.EqualFold(s.rowImage, "FULL") {
		return fmt.Errorf("the server writes row events with binlog_row_image = %s, and the relay needs the outbox's whole "+
			"row in each: SET GLOBAL binlog_row_image = 'FULL', and set binlog_row_image = FULL in the option file so "+
			"that a restart keeps it (sessions opened before keep theirs: let the writers reconnect)", s.rowImage)
	}
	if s.serverID == serverID {
		return fmt.Errorf("the relay's ServerID %d is the server's own server_id: give the relay another "+
			"(Config.ServerID), unique among the server's replicas and relays", serverID)
	}
	return nil
}

// checkPrivileges probes the privilege that shows the binary log's status: BINLOG MONITOR on
// MariaDB, REPLICATION CLIENT on MySQL. (REPLICATION SLAVE, for reading the log, is checked when
// the relay asks the server for it: see deniedReading.)
func (r *Relay) checkPrivileges(ctx context.Context, db *sql.DB, s settings) error {
	_, err := r.binlogStatus(ctx, db)
	if errorNumber(err) == errAccessDenied {
		return fmt.Errorf("user %s may not read the binary log's status (%v): %s", s.user, err, r.grant(s))
	}
	return err
}

// grant is the statement that gives the relay's user what it needs to read the binary log.
func (r *Relay) grant(s settings) string {
	if s.flavor == flavorMariaDB {
		return "GRANT BINLOG MONITOR, REPLICATION SLAVE ON *.* TO " + s.account()
	}
	return "GRANT REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO " + s.account()
}

// deniedReading is the refusal of the binary log to a user without REPLICATION SLAVE.
func (r *Relay) deniedReading(s settings, err error) error {
	return fatal("user %s may not read the binary log (%v): %s", s.user, err, r.grant(s))
}

// binlogStatus reads the server's current binary log file and position.
func (r *Relay) binlogStatus(ctx context.Context, db *sql.DB) (position, error) {
	rows, err := db.QueryContext(ctx, "SHOW MASTER STATUS")
	if errorNumber(err) == errSyntax {
		rows, err = db.QueryContext(ctx, "SHOW BINARY LOG STATUS") // MySQL 8.4 and later
	}
	if err != nil {
		return position{}, fmt.Errorf("read the binary log's status: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return position{}, fmt.Errorf("read the binary log's status: %w", err)
	}
	var p position
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return p, fmt.Errorf("read the binary log's status: %w", err)
		}
		return p, errors.New("the server shows no binary log status: its binary log is off")
	}
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return p, fmt.Errorf("read the binary log's status: %w", err)
	}
	for i, c := range cols {
		switch strings.ToLower(c) {
		case "file":
			p.file = string(vals[i])
		case "position":
			n, err := strconv.ParseUint(string(vals[i]), 10, 32)
			if err != nil {
				return p, fmt.Errorf("read the binary log's status: position %q: %w", vals[i], err)
			}
			p.pos = uint32(n)
		}
	}
	return p, rows.Err()
}

// currentPosition is where the binary log ends now: the position a relay group's first start
// reads on from.
func (r *Relay) currentPosition(ctx context.Context, db *sql.DB, s settings, gtid bool) (position, error) {
	p, err := r.binlogStatus(ctx, db)
	if err != nil {
		return p, err
	}
	if !gtid {
		return p, nil
	}
	q := "SELECT @@GLOBAL.gtid_binlog_pos"
	if s.flavor == flavorMySQL {
		q = "SELECT @@GLOBAL.gtid_executed"
	}
	if err := db.QueryRowContext(ctx, q).Scan(&p.gtid); err != nil {
		return p, fmt.Errorf("read the server's GTID position: %w", err)
	}
	p.gtid = strings.Join(strings.Fields(p.gtid), "") // MySQL breaks a long set over lines
	return p, nil
}

// checkReplicas refuses a ServerID that another replica of the server uses (SHOW SLAVE HOSTS on
// MariaDB, SHOW REPLICAS on MySQL): the server would drop one of the two connections for the
// other, over and over. A replica registered under the relay's own host name is the relay group
// itself — a connection of an earlier session the server has not dropped yet — and is no clash.
// It reports false when the user may not list the replicas (MariaDB: REPLICATION MASTER ADMIN)
// and the check could not be made.
func (r *Relay) checkReplicas(ctx context.Context, db *sql.DB, s settings) (checked bool, err error) {
	q := "SHOW SLAVE HOSTS"
	if s.flavor == flavorMySQL {
		q = "SHOW REPLICAS"
	}
	rows, err := db.QueryContext(ctx, q)
	if errorNumber(err) == errAccessDenied {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("list the server's replicas (%s): %w", q, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return false, fmt.Errorf("list the server's replicas: %w", err)
	}
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return false, fmt.Errorf("list the server's replicas: %w", err)
		}
		var id, host, port string
		for i, c := range cols {
			switch strings.ToLower(c) {
			case "server_id":
				id = string(vals[i])
			case "host":
				host = string(vals[i])
			case "port":
				port = string(vals[i])
			}
		}
		if id == strconv.FormatUint(uint64(r.serverID), 10) && host != r.host {
			return true, fatal("server_id %d is taken by another replica of the server (host %q, port %s, as %s lists it): "+
				"give the relay another ServerID (Config.ServerID), unique among the server's replicas and relays", r.serverID, host, port, q)
		}
	}
	return true, rows.Err()
}

// checkSchema refuses an outbox that is not migrated, and creates the relay's checkpoint table.
func (r *Relay) checkSchema(ctx context.Context, db *sql.DB, s settings) error {
	if err := r.fcfg.Store.CheckSchema(ctx); err != nil {
		if errors.Is(err, store.ErrNotMigrated) || errors.Is(err, store.ErrNewerSchema) {
			return err
		}
		return fmt.Errorf("check the outbox's tables: %w", err)
	}
	if _, err := db.ExecContext(ctx, r.sql.createCheckpoints); err != nil {
		if n := errorNumber(err); n == errTableAccessDenied || n == errDBAccessDenied {
			return fmt.Errorf("create the relay's checkpoint table %s.binlog_relays (%v): "+
				"GRANT CREATE, SELECT, INSERT, UPDATE ON `%s`.* TO %s, or create it as another user once", r.database, err, r.database, s.account())
		}
		return fmt.Errorf("create the relay's checkpoint table %s.binlog_relays: %w", r.database, err)
	}
	return nil
}
