// Package sqlitestore is outboxkit's store on SQLite, in pure Go (modernc.org/sqlite, no cgo),
// through database/sql: the application's transactions are *sql.Tx. It is the embedded default —
// a service, a demo or a test that needs no database server.
//
// SQLite has one writer at a time: a relay leases the rows it publishes (UPDATE … RETURNING, then
// a mark fenced by the lease) instead of holding a transaction across the publish, which would stop
// every writer; writers wake the relays of the same store in-process, under a short poll; a
// message's deliveries are serialized in-process, and across processes the inbox row still lets
// exactly one delivery apply its effect.
//
// Open it with Open, which sets WAL, a busy timeout and BEGIN IMMEDIATE; a handle of your own
// should set the same (see DSN).
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlite"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Name names the database in errors and Info: its file path. Default "sqlite".
	Name string
}

// Store is a store.Driver[*sql.Tx].
type Store struct {
	*sqlstore.Store
	db *sql.DB
}

var _ store.Driver[*sql.Tx] = (*Store)(nil)

// New returns the store of the SQLite database db opens. Writers and relays using the same db
// (this Store, or another one made with it) wake one another. It does not touch the database.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: db is nil: open the database (sqlitestore.Open does) and pass it")
	}
	if cfg.Name == "" {
		cfg.Name = "sqlite"
	}
	d := sqlite.New(cfg.Name, fmt.Sprintf("%p", db))
	return &Store{Store: sqlstore.New(dbexec.WithNumbered(dbexec.Std(db)), d), db: db}, nil
}

// UnwrapTx is the store's view of the application's transaction.
func (s *Store) UnwrapTx(tx *sql.Tx) store.Tx {
	return s.Store.UnwrapTx(dbexec.WithNumberedTx(dbexec.StdTx(tx)))
}

// DB is the pool the store uses.
func (s *Store) DB() *sql.DB { return s.db }

// DSN is the data source name Open uses for the file at path: WAL (readers never wait for the
// writer), a 10-second busy timeout (writers queue rather than fail), and BEGIN IMMEDIATE for every
// transaction (a transaction takes the write lock at once, instead of failing when a read turns
// into a write).
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

func init() {
	store.Register(openURL, "sqlite://path/to/file.db or sqlite:///absolute/path.db (SQLite)", "sqlite")
}

func openURL(ctx context.Context, rawURL string, opts store.OpenOptions) (*store.DB, error) {
	path := rawURL[strings.Index(rawURL, "://")+3:]
	if path == "" {
		return nil, fmt.Errorf("database URL %q names no file: use sqlite://path/to/file.db or sqlite:///absolute/path.db", rawURL)
	}
	if opts.MustExist {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("database URL %q: %w (the file must exist: check the path, or create it with Migrate, `outboxctl migrate`)", rawURL, err)
		}
	}
	s, err := Open(ctx, path)
	if err != nil {
		return nil, err
	}
	s.DB().SetMaxOpenConns(opts.MaxConns)
	return &store.DB{Driver: s, SQL: s.DB(), Dialect: "sqlite"}, nil
}

// Open opens the SQLite database at path (created if missing, with its directory) and returns
// its store. Close the store's DB when done. store.Open opens sqlite:// URLs with it.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlitestore: no path: name the database file, e.g. .cache/outboxkit.db")
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlitestore: create the directory of %s: %w", path, err)
		}
	}
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	s, err := New(db, Config{Name: path})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}
