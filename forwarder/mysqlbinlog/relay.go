// Package mysqlbinlog is the binlog relay: a source for the forwarder that reads the outbox's rows
// from the binary log of MySQL or MariaDB, as a replica does, instead of claiming them. Rows
// arrive in commit order, with no claim query, no UPDATE per event and no polling; they go through
// the forwarder's publish path (the Relay is a forwarder.Source, run by forwarder.RunSource: the
// broker circuit, backoff, dead-lettering, pauses, heartbeat, metrics, tracing), so a broker sees
// the same messages as from the polling relay.
//
// The relay publishes in rounds: each round hands the forwarder's PublishRows the rows read and
// not yet published, in commit order — at most BatchSize, a key's rows behind its first one that
// backs off or is paused left for later — and the forwarder publishes each key's rows in that
// order, MaxInFlight keys at once. A key's rows are so published in commit order; rows of
// different keys are not held back by one another.
//
// Progress is a checkpoint row in the outbox's database (table binlog_relays, created by the
// relay): the GTID set read up to (MariaDB's, or MySQL's with gtid_mode = ON), or the binary log
// file and position where the server has no GTIDs. The relay removes the published rows behind
// it and records it in one transaction — one DELETE for the rows, in bulk, and one upsert of the
// checkpoint, every FlushInterval or FlushRows — never an UPDATE per event. (MySQL has no
// statement that writes two tables, as Postgres's data-modifying WITH does: the transaction
// makes the two one.) A relay starting again reads on from the checkpoint: the rows published
// since the last one are published again — a duplicate, never a loss. While a row waits (backing
// off, paused) the checkpoint stays behind it; the rows published after it leave the table all
// the same, and are published again if the relay starts again before the checkpoint passes the
// waiting row. The first start of a
// relay group reads the rows already waiting in the table, then the log from where it ended
// when it started.
//
// When the server cannot send the log from the checkpoint (error 1236: the binary logs holding
// it were purged — expired, or PURGE BINARY LOGS — while the relay was down; or the server is
// another one than the checkpoint's, after a failover or a restore, and lacks its GTIDs or its
// file), the relay recovers as a first start does, and logs the lost position (at WARN
// where the logger has the level, else ERROR). It removes rows only once they are published, so
// the rows left in the outbox, not dead-lettered, are exactly the ones it may not have published:
// it records the log's end as its checkpoint, reads those rows, then the log from that end.
// Nothing is lost; the rows published since the last checkpoint are published again; a row
// backing off keeps its attempts; dead letters stay, and one replayed meanwhile waits in the
// table and goes. Only a refusal that no recovery fixes — the server refusing its own end, or
// again the position a recovery started from — stops Run. Where progress is tracked by file and
// position, a failover to a server whose binary logs hold a file of the checkpoint's name is not
// seen: the relay reads that file from the checkpoint's position, which means another place
// there; track progress by GTIDs where the server has them, or delete the checkpoint row after
// such a failover (the relay then starts as a group's first start does).
//
// A row that fails backs off, its key's later rows behind it, and its attempt is recorded in the
// outbox as the polling relay records it (attempts, last_error, next_attempt_at); at
// MaxAttempts, or when the failure is permanent, it is dead-lettered there, in the checkpoint's
// transaction that moves past it, for outboxctl and the console. A replayed dead letter is
// published again: the relay reads the replay's UPDATE from the log.
//
// One relay of a group reads at a time: it holds a lock named after the group (GET_LOCK) on the
// connection that writes its checkpoints, and another relay of the group stands by, waiting in
// GET_LOCK, which the server grants it the moment that connection ends. A relay whose process dies
// (a crash, kill -9: the kernel closes its connections) is so followed at once — the standby reads
// the log tens of milliseconds later. The lock connection's wait_timeout is the lease, 10s: a relay
// whose host vanishes without closing its connections (a partition, a power cut) loses the lock
// once the server has not heard from it for that long, and is followed then.
//
// The relay holding the lock asks the server every 250ms whether its connection still holds it
// (IS_USED_LOCK). Once the answer is no, or the connection fails (the server killed it: KILL, a
// restart, the lease run out), or no answer came for half the lease, it publishes no more row
// (a publish already under way may still reach the broker), writes no checkpoint, and stands by
// again. Cut off from the server, it so stops before the lease ends, and before another relay can
// take the lock; with its connection killed on the server, the lock is free at once and the two
// may publish together for up to 250ms. Either way the relay that reads on publishes again the
// rows published since the last checkpoint: a duplicate, never a loss.
//
// The server needs the binary log on, binlog_format = ROW, binlog_row_image = FULL, a user with
// REPLICATION SLAVE and BINLOG MONITOR (REPLICATION CLIENT on MySQL), and a server_id for the
// relay that no replica of the server has; Run checks each at start and says what to do.
package mysqlbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// Relay reads the outbox from the binary log and publishes it. Run may run once at a time.
type Relay struct {
	cfg      Config
	fcfg     forwarder.Config
	database string // the outbox's
	sql      statements
	serverID uint32
	host     string // the name the relay registers with the server as a replica
	lockName string
	log      watermill.LoggerAdapter
	fields   watermill.LogFields

	// The replication connection's address and credentials, from URL.
	addr, user, password string

	running atomic.Bool
	active  atomic.Bool // reading the binary log now
	// replicasUnchecked: the user may not list the server's replicas, which was logged once.
	replicasUnchecked atomic.Bool
	hooks             hooks
	// recovered is the position this Run's last recovery recorded, nil for none (Run's goroutine
	// only): refused again before the checkpoint moved, it is a fault no recovery fixes.
	recovered *position

	mu      sync.Mutex
	reading chan struct{} // closed when the relay starts reading the log; replaced when it stops
}

// hooks let tests provoke faults and watch the relay. They are zero in production.
type hooks struct {
	// lease replaces lockLease.
	lease time.Duration
	// crash makes Run return at ctx's end without its last checkpoint, as a killed process would.
	crash bool
	// flushes counts the checkpoints written.
	flushes atomic.Int64
	// recoveries counts the recoveries from a checkpoint the server could not send the log from
	// (recoverFromTable); the log line of each says how many so far.
	recoveries atomic.Int64
	// refuseLog makes every reading of the log fail as the server's refusal to send it (1236).
	refuseLog bool
	// beforeCheckpoint runs in each checkpoint that removes published rows, before it writes
	// anything (faults.InjectBeforeConfirm); an error fails the checkpoint there.
	beforeCheckpoint func() error
}

func init() {
	faults.RegisterBeforeConfirm(func(r any, fn func() error) bool {
		br, ok := r.(*Relay)
		if ok {
			br.hooks.beforeCheckpoint = fn
		}
		return ok
	})
}

// New validates cfg and builds a Relay. It does not touch the database.
func New(cfg Config) (*Relay, error) {
	var errs []error
	if cfg.Forwarder == nil {
		errs = append(errs, errors.New("field Forwarder is required: build one with forwarder.New (its Publisher receives the events) on the outbox's mysqlstore"))
	}
	var addr, user, password string
	if cfg.URL == "" {
		errs = append(errs, errors.New("field URL is required: mysql://user:pass@host:3306/db of the server holding the outbox"))
	} else if a, u, p, err := parseURL(cfg.URL); err != nil {
		errs = append(errs, err)
	} else {
		addr, user, password = a, u, p
	}
	def := func(d *time.Duration, v time.Duration, field string) {
		if *d == 0 {
			*d = v
		}
		if *d < 0 {
			errs = append(errs, fmt.Errorf("field %s must be positive, got %s", field, *d))
		}
	}
	def(&cfg.FlushInterval, DefaultFlushInterval, "FlushInterval")
	def(&cfg.Heartbeat, DefaultHeartbeat, "Heartbeat")
	if cfg.FlushRows == 0 {
		cfg.FlushRows = DefaultFlushRows
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.FlushRows < 1 || cfg.Window < 1 {
		errs = append(errs, fmt.Errorf("fields FlushRows and Window must be at least 1, got %d and %d", cfg.FlushRows, cfg.Window))
	}
	var fcfg forwarder.Config
	if cfg.Forwarder != nil {
		fcfg = cfg.Forwarder.Config()
		if info := fcfg.Store.Info(); info.Name != "mysql" {
			errs = append(errs, fmt.Errorf("field Forwarder: its store is %q, and the binlog relay reads a MySQL or MariaDB outbox: "+
				"build the forwarder on a mysqlstore (for Postgres, forwarder/pglog reads the write-ahead log)", info.Name))
		}
		if fcfg.ParkKeyOnDeadLetter {
			errs = append(errs, errors.New("field Forwarder: ParkKeyOnDeadLetter is not supported by the binlog relay yet: "+
				"turn it off, or use the polling relay (forwarder.Run)"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("mysqlbinlog config: %w", err)
	}
	r := &Relay{cfg: cfg, fcfg: fcfg, database: fcfg.Store.Info().Schema, log: fcfg.Logger,
		addr: addr, user: user, password: password, reading: make(chan struct{})}
	r.sql = newStatements(r.database)
	r.serverID = cfg.ServerID
	if r.serverID == 0 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(r.database + "\x00" + fcfg.Name))
		r.serverID = 1<<31 | h.Sum32()&(1<<31-1)
	}
	r.host = truncate("outboxkit "+r.database+"/"+fcfg.Name, 255)
	r.lockName = lockName(r.database, fcfg.Name)
	r.fields = watermill.LogFields{"relay": fcfg.Name, "database": r.database, "server_id": r.serverID}
	return r, nil
}

// parseURL takes the replication connection's address and credentials from a mysql:// URL.
func parseURL(raw string) (addr, user, password string, err error) {
	if _, err := mysqlstore.DSN(raw); err != nil {
		return "", "", "", fmt.Errorf("field URL: %w", err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", "", fmt.Errorf("field URL: %w", err)
	}
	if !strings.EqualFold(u.Scheme, "mysql") {
		return "", "", "", fmt.Errorf("field URL: %q is not a mysql:// URL", u.Redacted())
	}
	addr = u.Host
	if u.Port() == "" {
		addr += ":3306"
	}
	if u.User != nil {
		user = u.User.Username()
		password, _ = u.User.Password()
	}
	return addr, user, password, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ServerID is the server_id the relay reads the binary log as.
func (r *Relay) ServerID() uint32 { return r.serverID }

// Active reports whether the relay reads the binary log now (false while it waits for another
// relay of its group, or for the server).
func (r *Relay) Active() bool { return r.active.Load() }

// Reading returns a channel closed once the relay reads the binary log (after a first start's
// reading of the table): from then on rows committed arrive. After the relay stops reading, a new
// channel is returned.
func (r *Relay) Reading() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reading
}

func (r *Relay) setActive(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active.Swap(on) == on {
		return
	}
	if on {
		close(r.reading)
	} else {
		r.reading = make(chan struct{})
	}
}

// Run relays until ctx ends, then records a last checkpoint of what it published and returns nil
// once every goroutine it started has stopped.
//
// It checks the server at start and returns an error saying what to do when the relay cannot
// work there: the binary log off, binlog_format not ROW, binlog_row_image not FULL, a user
// without the privileges to read the log, a ServerID that is the server's own or another
// replica's, the outbox not migrated; and later, a row event without the outbox's columns, or a
// binary log the server refuses to send even from where a recovery started (a checkpoint the
// server's binary logs no longer hold is recovered from, see the package doc). Lost
// connections, a server restarting and broker outages never end it: it reconnects with the
// forwarder's CircuitBackoff and reads again from its last checkpoint (rows published since are
// published again: a duplicate, never a loss). While another relay of its group reads the log,
// it waits.
//
// It runs through its Forwarder's RunSource, which reads the pauses and reports the relay (the
// console lists it) every HeartbeatInterval from the start; so it may not run at once with the
// Forwarder's Run or another source's run on it.
func (r *Relay) Run(ctx context.Context) error { return r.cfg.Forwarder.RunSource(ctx, r) }

var _ forwarder.Source = (*Relay)(nil)

// Relay is the binlog relay as a forwarder.Source: Run hands it to its Forwarder's RunSource,
// which runs the heartbeat beside it, and it does all that Run says with sr as its publish path
// and pauses. Call Run; Relay is exported to implement the interface.
func (r *Relay) Relay(ctx context.Context, sr *forwarder.SourceRelay) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("mysqlbinlog: Run is already running on this Relay; create another Relay for a second relay of the group")
	}
	defer r.running.Store(false)
	r.recovered = nil
	if sr.Transactions() != nil {
		return fmt.Errorf("binlog relay %s: the forwarder's publisher is transactional, which the binlog relay does not support yet: "+
			"use the polling relay (forwarder.Run) with it, or a publisher without transactions", r.fcfg.Name)
	}
	dsn, err := mysqlstore.DSN(r.cfg.URL)
	if err != nil {
		return err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fmt.Errorf("binlog relay %s: %w", r.fcfg.Name, err)
	}
	defer db.Close()
	// The checkpoint's connection (which holds the lock), the statements beside it and a page
	// of the first start's reading of the table.
	db.SetMaxOpenConns(4)

	s, err := r.checkServer(ctx, db)
	if err != nil {
		return fmt.Errorf("binlog relay %s: %w", r.fcfg.Name, err)
	}
	mode := "file and position"
	if s.useGTID(r.cfg.FilePosition) {
		mode = "GTID"
	}
	r.log.Info("Binlog relay starting", r.fields.Add(watermill.LogFields{"server": s.version, "progress": mode}))
	failures := 0
	for {
		err := r.session(ctx, db, s, sr)
		r.setActive(false)
		if ctx.Err() != nil {
			r.log.Info("Binlog relay stopped", r.fields)
			return nil
		}
		var wait time.Duration
		switch {
		case err == nil:
			failures, wait = 0, r.fcfg.CircuitBackoff.Delay(1) // the stream ended without an error: read on
		case errors.Is(err, errRecovered):
			failures, wait = 0, r.fcfg.CircuitBackoff.Delay(1) // read the rows left in the outbox, then the log from its end
		case isFatal(err):
			return fmt.Errorf("binlog relay %s: %w", r.fcfg.Name, err)
		default:
			failures++
			wait = r.fcfg.CircuitBackoff.Delay(failures)
			r.log.Error("Binlog relay session failed, reading again from the last checkpoint", err,
				r.fields.Add(watermill.LogFields{"retry_in": wait}))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// checkServer refuses what no retry fixes, each with what to do about it.
func (r *Relay) checkServer(ctx context.Context, db *sql.DB) (settings, error) {
	s, err := r.readSettings(ctx, db)
	if err != nil {
		return s, err
	}
	if err := checkSettings(s, r.serverID); err != nil {
		return s, err
	}
	if err := r.checkPrivileges(ctx, db, s); err != nil {
		return s, err
	}
	return s, r.checkSchema(ctx, db, s)
}

// fatalError is a condition no retry ends: the relay returns it.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

func fatal(format string, args ...any) error { return fatalError{fmt.Errorf(format, args...)} }

func isFatal(err error) bool {
	var f fatalError
	return errors.As(err, &f)
}
