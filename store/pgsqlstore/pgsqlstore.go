// Package pgsqlstore is outboxkit's store on Postgres through database/sql — lib/pq, or pgx's
// stdlib driver — for teams whose code holds a *sql.Tx (sqlx, GORM, plain database/sql): the
// publisher, the forwarder, the inbox and the typed handlers all work with *sql.Tx, and no pgx
// type appears in the team's code.
//
// It shares its SQL, migrations, claim and locks with store/pgxstore. Relays are woken by NOTIFY
// when Config.ListenURL names the database (Open sets it), or through a LISTEN connection that
// the stores of many schemas share (Config.Listener, a pgxstore.Listener); otherwise they poll.
package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver, the default

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/pg"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Schema is the Postgres schema holding outboxkit's tables. Default "outboxkit".
	Schema string
	// DisableNotify stops writers from waking relays with pg_notify. Default false.
	DisableNotify bool
	// ListenURL is a postgres:// URL for the relay's LISTEN connection, made with pgx beside the
	// database/sql pool (database/sql has no notifications). Default "": relays poll.
	ListenURL string
	// ListenRetry is the wait before the LISTEN connection is opened again. Default 2s.
	ListenRetry time.Duration
	// Listener, when set, wakes the store's relays through a LISTEN connection shared with the
	// stores of other schemas of the same database (pgxstore.NewListener) instead of one of their
	// own. Default nil. Setting it with ListenURL is an error.
	Listener store.SharedListener
	// WAL writes each event as a logical decoding message in the writer's transaction instead of
	// an outbox row, for the log relay in WAL mode: see pgxstore.Config.WAL. Default false.
	WAL bool
}

// Store is a store.Driver[*sql.Tx].
type Store struct {
	*sqlstore.Store
	db *sql.DB
}

var _ store.Driver[*sql.Tx] = (*Store)(nil)

// New returns the store of the database db reaches. It does not touch the database.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgsqlstore: db is nil: open the database (sql.Open(\"pgx\", url), or store.Open) and pass it")
	}
	pcfg := pg.Config{Schema: cfg.Schema, Driver: "database/sql", DisableNotify: cfg.DisableNotify, ListenRetry: cfg.ListenRetry,
		WAL: cfg.WAL}
	switch {
	case cfg.Listener != nil && cfg.ListenURL != "":
		return nil, errors.New("pgsqlstore: Config.Listener and Config.ListenURL are both set: the relays listen through one or the other; drop one")
	case cfg.Listener != nil:
		pcfg.Listener = cfg.Listener
	case cfg.ListenURL != "":
		url := cfg.ListenURL
		pcfg.ListenConnect = func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) }
	}
	d, err := pg.New(pcfg)
	if err != nil {
		return nil, err
	}
	return &Store{Store: sqlstore.New(dbexec.Std(db), d), db: db}, nil
}

// UnwrapTx is the store's view of the application's transaction.
func (s *Store) UnwrapTx(tx *sql.Tx) store.Tx { return s.Store.UnwrapTx(dbexec.StdTx(tx)) }

// DB is the pool the store uses.
func (s *Store) DB() *sql.DB { return s.db }

func init() {
	store.Register(open, "postgres://user:pass@host:5432/db (Postgres)", "postgres", "postgresql")
}

// open is store.Open for postgres:// URLs: a database/sql handle through the driver
// OpenOptions.SQLDriver names (pgx's stdlib by default; "postgres" for lib/pq, which the program
// imports), and a LISTEN connection of its own unless PollOnly or a shared Listener.
func open(ctx context.Context, rawURL string, opts store.OpenOptions) (*store.DB, error) {
	driver := opts.SQLDriver
	if driver == "" {
		driver = "pgx"
	}
	if !slices.Contains(sql.Drivers(), driver) {
		hint := ""
		if driver == "postgres" {
			hint = `: import _ "github.com/lib/pq"`
		}
		return nil, fmt.Errorf("database/sql driver %q is not registered in this program%s", driver, hint)
	}
	db, err := sql.Open(driver, rawURL)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", store.RedactURL(rawURL), err)
	}
	db.SetMaxOpenConns(opts.MaxConns)
	cfg := Config{Schema: opts.Schema, DisableNotify: opts.DisableNotify, Listener: opts.Listener}
	if !opts.PollOnly && opts.Listener == nil {
		cfg.ListenURL = rawURL
	}
	s, err := New(db, cfg)
	return store.Finish(ctx, db, s, err, "postgres", rawURL, nil)
}
