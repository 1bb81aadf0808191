package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// binlogServer is the MySQL or MariaDB server of --scenario binlog, with the bench's own session
// on it: the one connection the bench runs its statements on (databases made and dropped, the
// server's counters and sessions read), so that its own statements are known and its session can
// be left out of the relays'.
type binlogServer struct {
	url string // --binlog-db
	db  *sql.DB
	own *sql.Conn
	// pid is the server's process id when it runs on this machine (its threads' CPU is read from
	// /proc), 0 when it does not.
	pid int
	// header says what the server is and how it flushes.
	header string
	// oneRead is what one read of the counters adds to them: the bench's own statement, taken
	// out of every window.
	oneRead statusCounters
}

func openBinlogServer(ctx context.Context, rawURL string) (*binlogServer, error) {
	const hint = "start the private server with the binary log on (scripts/mariadb-binlog.sh start) and point --binlog-db " +
		"(default $OUTBOXKIT_TEST_MYSQLBINLOG_URL) at it: scripts/mariadb-binlog.sh url prints its URL"
	if rawURL == "" {
		return nil, errors.New("--scenario binlog needs a server with the binary log on and no --binlog-db was given: " + hint)
	}
	dsn, err := mysqlstore.DSN(rawURL)
	if err != nil {
		return nil, fmt.Errorf("--binlog-db: %w", err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("--binlog-db: %w", err)
	}
	db.SetMaxOpenConns(1)
	s := &binlogServer{url: rawURL, db: db}
	if s.own, err = db.Conn(ctx); err == nil {
		err = s.own.PingContext(ctx)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot reach the server at %s (%w): %s", store.RedactURL(rawURL), err, hint)
	}
	var (
		version, format, image string
		logBin                 int
		flushAtCommit, syncBin string
	)
	if err := s.own.QueryRowContext(ctx, `SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image,
		@@innodb_flush_log_at_trx_commit, @@sync_binlog`).Scan(&version, &logBin, &format, &image, &flushAtCommit, &syncBin); err != nil {
		s.close()
		return nil, fmt.Errorf("read the server's settings at %s: %w", store.RedactURL(rawURL), err)
	}
	if logBin != 1 || !strings.EqualFold(format, "ROW") || !strings.EqualFold(image, "FULL") {
		s.close()
		return nil, fmt.Errorf("%s runs log_bin = %d, binlog_format = %s, binlog_row_image = %s, and the binlog relay needs the binary log on "+
			"in ROW format with FULL images (the shared server on :3306 has no binary log): %s", store.RedactURL(rawURL), logBin, format, image, hint)
	}
	durable := "each commit flushed to disk"
	if flushAtCommit != "1" || syncBin != "1" {
		durable = "commits NOT flushed to disk at each commit (a test server's my.cnf): writers are faster than on a durable server"
	}
	s.header = fmt.Sprintf("%s %s, binlog_format = %s, innodb_flush_log_at_trx_commit = %s, sync_binlog = %s: %s",
		store.RedactURL(rawURL), version, format, flushAtCommit, syncBin, durable)
	s.pid = s.serverPID(ctx)
	// Two reads back to back: the second's change is the bench's own read.
	a, err := s.counters(ctx)
	if err == nil {
		var b statusCounters
		b, err = s.counters(ctx)
		s.oneRead = b.minus(a)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("read the server's statement counters (SHOW GLOBAL STATUS): %w", err)
	}
	return s, nil
}

func (s *binlogServer) close() {
	_ = s.own.Close()
	_ = s.db.Close()
}

// serverPID finds the server's process from its thread serving the bench's session, when the
// server runs on this machine and says its threads' ids (MariaDB's PROCESSLIST.TID); else 0.
func (s *binlogServer) serverPID(ctx context.Context) int {
	var tid int
	if err := s.own.QueryRowContext(ctx, "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()").Scan(&tid); err != nil {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			pid, _ := strconv.Atoi(strings.TrimSpace(v))
			return pid
		}
	}
	return 0
}

// statusCounters are the server's statement counters: Questions (every statement a client sent)
// and the Com_ counters (by kind), from SHOW GLOBAL STATUS.
type statusCounters map[string]int64

func (s *binlogServer) counters(ctx context.Context) (statusCounters, error) {
	rows, err := s.own.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name = 'Questions' OR Variable_name LIKE 'Com\_%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pairs [][2]string
	for rows.Next() {
		var p [2]string
		if err := rows.Scan(&p[0], &p[1]); err != nil {
			return nil, err
		}
		pairs = append(pairs, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return parseStatus(pairs)
}

// parseStatus reads SHOW GLOBAL STATUS's rows of counters.
func parseStatus(rows [][2]string) (statusCounters, error) {
	c := statusCounters{}
	for _, r := range rows {
		n, err := strconv.ParseInt(r[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("status variable %s = %q is not a counter", r[0], r[1])
		}
		c[r[0]] = n
	}
	if _, ok := c["Questions"]; !ok {
		return nil, errors.New("SHOW GLOBAL STATUS has no Questions counter")
	}
	return c, nil
}

// minus is c less before, counter by counter.
func (c statusCounters) minus(before statusCounters) statusCounters {
	d := statusCounters{}
	for k, v := range c {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	return d
}

// statements is what ran between two reads of the counters (before, then after), per event:
// the change less the later read's own statement (oneRead) and less each of others (what the
// bench knows others sent meanwhile: the writers'), divided by events.
func statements(before, after, oneRead statusCounters, events int, others ...stmtRates) stmtRates {
	d := after.minus(before).minus(oneRead)
	r := stmtRates{}
	for k, v := range d {
		r[k] = float64(v) / float64(events)
	}
	for _, o := range others {
		for k, v := range o {
			r[k] -= v
		}
	}
	return r
}

// stmtRates are statement counts per event (or per second), by counter.
type stmtRates map[string]float64

// scaled is r times f: a per-event cost for f times as many events.
func (r stmtRates) scaled(f float64) stmtRates {
	s := stmtRates{}
	for k, v := range r {
		s[k] = v * f
	}
	return s
}

// total is every statement: Questions.
func (r stmtRates) total() float64 { return r["Questions"] }

// kinds lists the statement kinds (Com_ counters without the prefix), most first, those that
// round to zero at four decimals left out: "delete 0.0010, insert 0.0010, select 0.0002". The
// prepared statements' protocol commands (Com_stmt_prepare, _execute, _close: go-sql-driver
// prepares each statement with arguments) are left out too: the statement itself is counted
// by its kind, and once in Questions.
func (r stmtRates) kinds() string {
	type kv struct {
		k string
		v float64
	}
	var l []kv
	for k, v := range r {
		name, ok := strings.CutPrefix(k, "Com_")
		if ok && !strings.HasPrefix(name, "stmt_") && (v >= 0.00005 || v <= -0.00005) {
			l = append(l, kv{name, v})
		}
	}
	slices.SortFunc(l, func(a, b kv) int {
		if a.v != b.v {
			if a.v > b.v {
				return -1
			}
			return 1
		}
		return strings.Compare(a.k, b.k)
	})
	var parts []string
	for _, e := range l {
		parts = append(parts, fmt.Sprintf("%s %.4f", e.k, e.v))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// serverCPU is the CPU time the server's process has used, or 0 when it does not run here.
func (s *binlogServer) serverCPU() time.Duration {
	if s.pid == 0 {
		return 0
	}
	d, _ := procStatCPU(fmt.Sprintf("/proc/%d/stat", s.pid))
	return d
}

// sessionsCPU is the CPU time of the server's threads serving this process's sessions, the bench's
// own left out: the relay's, once the writers are gone. Sessions are this process's when their
// client port is one of its sockets'.
func (s *binlogServer) sessionsCPU(ctx context.Context) (time.Duration, int, error) {
	if s.pid == 0 {
		return 0, 0, errors.New("the server does not run on this machine")
	}
	ports, err := ownPorts()
	if err != nil {
		return 0, 0, err
	}
	rows, err := s.own.QueryContext(ctx, "SELECT HOST, TID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	var total time.Duration
	n := 0
	for rows.Next() {
		var host string
		var tid int
		if err := rows.Scan(&host, &tid); err != nil {
			return 0, 0, err
		}
		_, port, ok := strings.Cut(host, ":")
		if p, err := strconv.Atoi(port); !ok || err != nil || !ports[p] {
			continue
		}
		d, err := procStatCPU(fmt.Sprintf("/proc/%d/task/%d/stat", s.pid, tid))
		if err != nil {
			continue // the session ended meanwhile
		}
		total += d
		n++
	}
	return total, n, rows.Err()
}

// procStatCPU reads a /proc stat file's user and system time.
func procStatCPU(path string) (time.Duration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(raw))
}

// parseProcStat takes utime and stime (fields 14 and 15, in clock ticks of 1/100 s) from a
// /proc/…/stat line; the command name in parentheses may hold spaces and parentheses.
func parseProcStat(line string) (time.Duration, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 || i+2 > len(line) {
		return 0, fmt.Errorf("not a /proc stat line: %.40q", line)
	}
	// After the name: state is field 3, so utime and stime are the 12th and 13th.
	f := strings.Fields(line[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("a /proc stat line of %d fields after the name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("a /proc stat line's utime and stime: %w", err)
	}
	return time.Duration(u+s) * time.Second / 100, nil
}

// ownPorts are the local TCP ports of this process's sockets.
func ownPorts() (map[int]bool, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if ino, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if err != nil {
			continue // no IPv6
		}
		for p := range tcpPorts(string(raw), inodes) {
			ports[p] = true
		}
	}
	return ports, nil
}

// tcpPorts reads a /proc/net/tcp table: the local ports of the sockets whose inode is in inodes.
func tcpPorts(table string, inodes map[string]bool) map[int]bool {
	ports := map[int]bool{}
	for _, l := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 10 || !inodes[f[9]] {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil {
			ports[int(p)] = true
		}
	}
	return ports
}

// binlogOutbox is a migrated outbox in a database of its own on the server, with the writers'
// store on it.
type binlogOutbox struct {
	name    string
	writers *store.DB
}

// newOutbox makes and migrates an outbox database named after prefix, its writers' pool holding
// a connection for each of writers, opened now: a connection's opening is a statement on the
// server (Questions), which a pool opening and closing connections as the writers come and go
// would add to every window; drop drops it.
func (s *binlogServer) newOutbox(ctx context.Context, prefix string, writers int) (*binlogOutbox, func(), error) {
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e9)
	w, err := s.open(ctx, name, writers)
	if err != nil {
		return nil, nil, err
	}
	w.SQL.SetMaxIdleConns(writers)
	o := &binlogOutbox{name: name, writers: w}
	drop := func() {
		_ = w.Close()
		_, _ = s.own.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`")
	}
	if _, err := pipeline.Migrate(ctx, w); err != nil {
		drop()
		return nil, nil, fmt.Errorf("migrate the outbox in %s: %w", name, err)
	}
	conns := make([]*sql.Conn, 0, writers)
	for range writers {
		conn, err := w.SQL.Conn(ctx)
		if err == nil {
			err = conn.PingContext(ctx)
		}
		if err != nil {
			drop()
			return nil, nil, fmt.Errorf("open the writers' connections: %w", err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		_ = conn.Close() // back to the pool, which keeps it
	}
	return o, drop, nil
}

// open is a store of the outbox in database name, on a pool of its own of maxConns.
func (s *binlogServer) open(ctx context.Context, name string, maxConns int) (*store.DB, error) {
	return store.Open(ctx, s.url, store.OpenOptions{Schema: name, MaxConns: maxConns})
}
