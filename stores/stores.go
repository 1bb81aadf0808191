// Package stores opens outboxkit's store for a database URL, the way package backends opens a
// broker: postgres://, mysql:// or sqlite://. Every store it opens works with *sql.Tx, so code
// that takes the URL from configuration — a service, outboxctl, the demo — runs on any of them
// unchanged. Teams on pgx build store/pgxstore from their pool instead.
package stores

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// Schemes lists the database URL forms Open understands.
const Schemes = "postgres://user:pass@host:5432/db (Postgres), mysql://user:pass@host:3306/db (MySQL 8, MariaDB 10.6+), " +
	"sqlite://path/to/file.db or sqlite:///absolute/path.db (SQLite)"

// DB is a store opened by URL, with the database/sql handle the application uses for its own
// tables (in the same transactions as its events).
type DB struct {
	store.Driver[*sql.Tx]
	// SQL is the database handle; Close closes it.
	SQL *sql.DB
	// Dialect is "postgres", "mysql" or "sqlite": the SQL the application's own statements speak.
	Dialect string
}

// Close closes the database handle.
func (d *DB) Close() error { return d.SQL.Close() }

// Options tune the store.
type Options struct {
	// Namespace holds outboxkit's tables: the Postgres schema or the MySQL database. Default
	// "outboxkit". SQLite keeps them in its file.
	Namespace string
	// DisableNotify stops Postgres writers from waking relays with pg_notify (they poll).
	DisableNotify bool
	// PollOnly opens no LISTEN connection on Postgres (PgBouncer in transaction mode).
	PollOnly bool
	// MaxConns bounds the database handle's open connections (sql.DB.SetMaxOpenConns): past it,
	// work waits for a connection instead of failing on the server's limit. A consumer holds one
	// for each delivery in progress. Default DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is the default of Options.MaxConns: well within the default connection limits
// of Postgres (100) and MySQL (151), with room for a few processes.
const DefaultMaxConns = 20

// Open connects to the database a URL names and returns its store. It checks that the database
// answers (and, for MySQL, that it is recent enough) and says what to do when it does not; it does
// not migrate (pipeline.Migrate does).
func Open(ctx context.Context, rawURL string, opts Options) (*DB, error) {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("database URL %q has no scheme: use one of %s", redact(rawURL), Schemes)
	}
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("stores: Options.MaxConns must be positive, got %d", opts.MaxConns)
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = DefaultMaxConns
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		db, err := sql.Open("pgx", rawURL)
		if err != nil {
			return nil, fmt.Errorf("database URL %s: %w", redact(rawURL), err)
		}
		db.SetMaxOpenConns(opts.MaxConns)
		cfg := pgsqlstore.Config{Schema: opts.Namespace, DisableNotify: opts.DisableNotify}
		if !opts.PollOnly {
			cfg.ListenURL = rawURL
		}
		s, err := pgsqlstore.New(db, cfg)
		return finish(pctx, db, s, err, "postgres", rawURL, nil)
	case "mysql":
		dsn, err := mysqlstore.DSN(rawURL)
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, fmt.Errorf("database URL %s: %w", redact(rawURL), err)
		}
		db.SetMaxOpenConns(opts.MaxConns)
		s, err := mysqlstore.New(db, mysqlstore.Config{Database: opts.Namespace})
		var check func(context.Context) error
		if err == nil {
			check = s.CheckVersion
		}
		return finish(pctx, db, s, err, "mysql", rawURL, check)
	case "sqlite":
		path := strings.TrimPrefix(rawURL[len(scheme):], "://")
		if path == "" {
			return nil, fmt.Errorf("database URL %q names no file: use sqlite://path/to/file.db or sqlite:///absolute/path.db", rawURL)
		}
		s, err := sqlitestore.Open(pctx, path)
		if err != nil {
			return nil, err
		}
		s.DB().SetMaxOpenConns(opts.MaxConns)
		return &DB{Driver: s, SQL: s.DB(), Dialect: "sqlite"}, nil
	}
	return nil, fmt.Errorf("database URL scheme %q is not supported: use one of %s", scheme, Schemes)
}

// finish checks the store built on db (its configuration first, then that the database answers
// and passes check) and returns it; on error it closes db.
func finish(ctx context.Context, db *sql.DB, s store.Driver[*sql.Tx], err error, dialect, rawURL string,
	check func(context.Context) error) (*DB, error) {
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("cannot reach the database at %s: %w (is it running? is the URL right?)", redact(rawURL), err)
	}
	if check != nil {
		if err := check(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("database at %s: %w", redact(rawURL), err)
		}
	}
	return &DB{Driver: s, SQL: db, Dialect: dialect}, nil
}

// redact hides the password of a URL for error messages.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "***")
			return strings.Replace(u.String(), "%2A%2A%2A", "***", 1)
		}
	}
	return raw
}

// Rebind turns a statement written with ? placeholders into dialect's: $1, $2, … on Postgres, left
// as it is on MySQL and SQLite. A ? inside a quoted string or identifier is left alone. It lets an
// application write its own statements once for every store Open opens.
func Rebind(dialect, query string) string {
	if dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	var quote rune // the quote we are inside, or 0
	for _, r := range query {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"' || r == '`':
			quote = r
		case r == '?':
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Rebind is Rebind for the database's dialect.
func (d *DB) Rebind(query string) string { return Rebind(d.Dialect, query) }
