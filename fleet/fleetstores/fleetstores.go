// Package fleetstores opens the outboxes of a relay fleet (package fleet) by URL, through
// outboxkit's store drivers: fleetstores.Opener() is the usual fleet.Config.Open.
//
// A fleet relays many outboxes that often share a database — a schema per tenant, two hundred
// schemas on one server — so the Opener keeps one database handle (one connection pool) per
// database URL, shared by every outbox on it, and closes it when the member no longer relays any
// of them. It imports every driver (Postgres through database/sql and pgx, MySQL, SQLite) and the
// log relay (forwarder/pglog); package fleet imports none, so a fleet with an Opener of its own
// compiles only its own.
package fleetstores

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// Option tunes an Opener.
type Option func(*options)

type options struct {
	maxConns int
	logMode  pglog.Mode
	pollOnly bool
}

// MaxConns bounds the open connections of each database handle, shared by every outbox on that
// database (sql.DB.SetMaxOpenConns, pgxpool's MaxConns): past it, relays wait for a connection.
// Default store.DefaultMaxConns (20).
func MaxConns(n int) Option { return func(o *options) { o.maxConns = n } }

// PollOnly opens no LISTEN connection on Postgres (PgBouncer in transaction mode carries no
// notifications): relays poll. Default false: one LISTEN connection per database, shared by the
// relays of every schema on it (pgxstore.Listener).
func PollOnly() Option { return func(o *options) { o.pollOnly = true } }

// LogMode is the writers' mode of the outboxes relayed from Postgres's write-ahead log
// (fleet.RelayLog): pglog.ModeTable (the default) or pglog.ModeWAL.
func LogMode(mode pglog.Mode) Option { return func(o *options) { o.logMode = mode } }

// Opener opens each outbox by its URL (fleet.Outbox.URL, in store.Open's form) and schema:
//
//	postgres://  store/pgsqlstore on a database/sql handle (pgx's driver) and a LISTEN
//	             connection (pgxstore.Listener), both shared per URL; with fleet.RelayLog,
//	             store/pgxstore on a pgxpool.Pool shared per URL, relayed by forwarder/pglog (a
//	             replication connection for each outbox)
//	mysql://     store/mysqlstore on a handle shared per URL; Schema is outboxkit's database
//	sqlite://    store/sqlitestore on a handle shared per file; Schema does not apply
//
// Each handle is opened when the first outbox on its database is, checked (a ping, and the
// server's version on MySQL) each time an outbox is opened, and closed when the last outbox on it
// is. Writers on Postgres wake the relays (NOTIFY, unless PollOnly); on MySQL and SQLite, written
// by other processes, the relays poll. The schemas are not migrated:
// migrate each outbox as a deploy step (pipeline.Migrate, outboxctl migrate); a relay refuses an
// outbox that is not, and the fleet shows the error in its Status.
func Opener(opts ...Option) fleet.Opener {
	o := options{maxConns: store.DefaultMaxConns, logMode: pglog.ModeTable}
	for _, opt := range opts {
		opt(&o)
	}
	h := &handles{opts: o, sql: map[string]*sqlHandle{}, pools: map[string]*poolHandle{}}
	return h.open
}

// handles are the database handles of one Opener, counted by the outboxes using them.
type handles struct {
	opts  options
	mu    sync.Mutex
	sql   map[string]*sqlHandle // by driver and data source
	pools map[string]*poolHandle
}

type sqlHandle struct {
	db       *sql.DB
	listener *pgxstore.Listener // Postgres's wake-ups, nil elsewhere
	refs     int
}

type poolHandle struct {
	pool *pgxpool.Pool
	refs int
}

func (h *handles) open(ctx context.Context, o fleet.Outbox) (fleet.Opened, error) {
	if h.opts.maxConns < 1 {
		return fleet.Opened{}, fmt.Errorf("fleetstores: MaxConns must be at least 1, got %d", h.opts.maxConns)
	}
	scheme, rest, ok := strings.Cut(o.URL, "://")
	if !ok {
		return fleet.Opened{}, fmt.Errorf("fleetstores: outbox %q: URL %q has no scheme: use postgres://, mysql:// or sqlite://",
			o.Name, store.RedactURL(o.URL))
	}
	scheme = strings.ToLower(scheme)
	if o.Relay == fleet.RelayLog {
		return h.openLog(ctx, o)
	}
	switch scheme {
	case "postgres", "postgresql":
		e, release, err := h.sqlDB(ctx, "pgx", o.URL, o.URL)
		if err != nil {
			return fleet.Opened{}, err
		}
		cfg := pgsqlstore.Config{Schema: o.Schema}
		if e.listener != nil {
			cfg.Listener = e.listener
		}
		s, err := pgsqlstore.New(e.db, cfg)
		return finish(s, release, err)
	case "mysql":
		dsn, err := mysqlstore.DSN(o.URL)
		if err != nil {
			return fleet.Opened{}, err
		}
		e, release, err := h.sqlDB(ctx, "mysql", dsn, o.URL)
		if err != nil {
			return fleet.Opened{}, err
		}
		s, err := mysqlstore.New(e.db, mysqlstore.Config{Schema: o.Schema})
		if err == nil {
			if err = s.CheckVersion(ctx); err != nil {
				err = fmt.Errorf("database at %s: %w", store.RedactURL(o.URL), err)
			}
		}
		return finish(s, release, err)
	case "sqlite":
		if rest == "" {
			return fleet.Opened{}, fmt.Errorf("fleetstores: outbox %q: URL %q names no file: use sqlite://path/to/file.db", o.Name, o.URL)
		}
		e, release, err := h.sqlDB(ctx, "sqlite", sqlitestore.DSN(rest), o.URL)
		if err != nil {
			return fleet.Opened{}, err
		}
		s, err := sqlitestore.New(e.db, sqlitestore.Config{Name: rest})
		return finish(s, release, err)
	default:
		return fleet.Opened{}, fmt.Errorf("fleetstores: outbox %q: URL scheme %s:// is not one of postgres://, mysql://, sqlite://",
			o.Name, scheme)
	}
}

// finish makes the Opened of s, or undoes the handle's use when err is set.
func finish(s store.Store, release func() error, err error) (fleet.Opened, error) {
	if err != nil {
		return fleet.Opened{}, errors.Join(err, release())
	}
	return fleet.Opened{Store: s, Close: release}, nil
}

// sqlDB is the shared handle of driver's source (with its LISTEN connection on Postgres), opened
// on first use, checked with a ping; release gives it back, and closes it after its last use.
func (h *handles) sqlDB(ctx context.Context, driver, source, rawURL string) (e *sqlHandle, release func() error, err error) {
	key := driver + "\x00" + source
	h.mu.Lock()
	e, ok := h.sql[key]
	if !ok {
		db, err := sql.Open(driver, source)
		if err != nil {
			h.mu.Unlock()
			return nil, nil, fmt.Errorf("database URL %s: %w", store.RedactURL(rawURL), err)
		}
		db.SetMaxOpenConns(h.opts.maxConns)
		// The relays of many schemas share the handle, each polling and heartbeating on its own
		// timer: with database/sql's default of two idle connections, an idle member at 200
		// schemas opened ~600 sessions a minute. Keep what they use, and let a quiet database's
		// connections go after a minute.
		db.SetMaxIdleConns(h.opts.maxConns)
		db.SetConnMaxIdleTime(time.Minute)
		e = &sqlHandle{db: db}
		if driver == "pgx" && !h.opts.pollOnly {
			if e.listener, err = pgxstore.NewListener(source, pgxstore.ListenerConfig{}); err != nil {
				h.mu.Unlock()
				_ = db.Close()
				return nil, nil, err
			}
		}
		h.sql[key] = e
	}
	e.refs++
	h.mu.Unlock()
	var once sync.Once
	release = func() error {
		var err error
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if e.refs--; e.refs == 0 {
				delete(h.sql, key)
				if e.listener != nil {
					e.listener.Close()
				}
				err = e.db.Close()
			}
		})
		return err
	}
	if err := e.db.PingContext(ctx); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("cannot reach the database at %s: %w", store.RedactURL(rawURL), err), release())
	}
	return e, release, nil
}

// openLog opens an outbox relayed from Postgres's write-ahead log.
func (h *handles) openLog(ctx context.Context, o fleet.Outbox) (fleet.Opened, error) {
	h.mu.Lock()
	e, ok := h.pools[o.URL]
	if !ok {
		cfg, err := pgxpool.ParseConfig(o.URL)
		if err != nil {
			h.mu.Unlock()
			return fleet.Opened{}, fmt.Errorf("database URL %s: %w", store.RedactURL(o.URL), err)
		}
		cfg.MaxConns = int32(min(h.opts.maxConns, math.MaxInt32))
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			h.mu.Unlock()
			return fleet.Opened{}, fmt.Errorf("database URL %s: %w", store.RedactURL(o.URL), err)
		}
		e = &poolHandle{pool: pool}
		h.pools[o.URL] = e
	}
	e.refs++
	h.mu.Unlock()
	var once sync.Once
	release := func() error {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if e.refs--; e.refs == 0 {
				delete(h.pools, o.URL)
				e.pool.Close()
			}
		})
		return nil
	}
	if err := e.pool.Ping(ctx); err != nil {
		_ = release()
		return fleet.Opened{}, fmt.Errorf("cannot reach the database at %s: %w", store.RedactURL(o.URL), err)
	}
	// The log relay reads the log: it needs no LISTEN connection.
	s, err := pgxstore.New(e.pool, pgxstore.Config{Schema: o.Schema, PollOnly: true})
	if err != nil {
		_ = release()
		return fleet.Opened{}, err
	}
	mode, pool := h.opts.logMode, e.pool
	return fleet.Opened{
		Store: s,
		Run: func(ctx context.Context, f *forwarder.Forwarder) error {
			r, err := pglog.New(pglog.Config{Forwarder: f, Pool: pool, Mode: mode})
			if err != nil {
				return err
			}
			return r.Run(ctx)
		},
		Close: release,
	}, nil
}
