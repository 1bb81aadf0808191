package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/schemes"
	"github.com/outboxkit/outboxkit/internal/urls"
)

// DB is a store opened by URL with Open, with the database/sql handle the application uses for its
// own tables (in the same transactions as its events). Every store Open opens works with *sql.Tx,
// so code that takes the URL from configuration — a service, outboxctl, the demo — runs on any of
// them unchanged.
type DB struct {
	Driver[*sql.Tx]
	// SQL is the database handle; Close closes it.
	SQL *sql.DB
	// Dialect is "postgres", "mysql" or "sqlite": the SQL the application's own statements speak.
	Dialect string
}

// Close closes the database handle.
func (d *DB) Close() error { return d.SQL.Close() }

// Rebind is Rebind for the database's dialect.
func (d *DB) Rebind(query string) string { return Rebind(d.Dialect, query) }

// OpenOptions tune a store opened by URL. Each field says which schemes it applies to.
type OpenOptions struct {
	// Schema holds outboxkit's tables: the Postgres schema, or the MySQL database (which MySQL
	// also calls a schema). Default "outboxkit". postgres, mysql; SQLite keeps the tables in its
	// file and ignores it, so that a tool can pass one Schema whatever the URL.
	Schema string
	// MaxConns bounds the database handle's open connections (sql.DB.SetMaxOpenConns): past it,
	// work waits for a connection instead of failing on the server's limit. A consumer holds one
	// for each delivery in progress. Default DefaultMaxConns. All schemes.
	MaxConns int
	// DisableNotify stops writers from waking relays with pg_notify (relays poll). postgres;
	// ignored where writers wake no relay by NOTIFY.
	DisableNotify bool
	// PollOnly opens no LISTEN connection (PgBouncer in transaction mode): relays poll. postgres;
	// ignored where there is no LISTEN connection to open.
	PollOnly bool
	// Listener wakes the store's relays through a LISTEN connection shared with the stores of
	// other schemas of the same database (pgxstore.NewListener), instead of one of their own.
	// Default nil. postgres; refused with PollOnly.
	Listener SharedListener
	// SQLDriver names the database/sql driver the store talks through: "pgx" (pgx's stdlib,
	// the default, imported by store/pgsqlstore) or "postgres" (lib/pq, which the program
	// imports itself). postgres.
	SQLDriver string
	// MustExist refuses a database file that does not exist yet instead of creating it, for tools
	// that only read (a mistyped path would otherwise show an empty database). sqlite.
	MustExist bool
}

// DefaultMaxConns is the default of OpenOptions.MaxConns: well within the default connection
// limits of Postgres (100) and MySQL (151), with room for a few processes.
const DefaultMaxConns = 20

// Opener opens the store a URL names; OpenOptions arrive checked, with defaults filled in.
type Opener func(ctx context.Context, rawURL string, opts OpenOptions) (*DB, error)

var registry = schemes.Registry[Opener]{
	What: "database",
	Packages: map[string]string{
		"postgres": "store/pgsqlstore", "postgresql": "store/pgsqlstore",
		"mysql": "store/mysqlstore", "sqlite": "store/sqlitestore",
	},
	All: "store/allstores",
}

// Register makes a driver's Opener available to Open for URLs of the given schemes; example shows
// the URL form in errors. Drivers call it from init, as database/sql drivers do: a program opens by
// URL only the stores it imports (store/allstores imports every one). It panics when a scheme is
// registered twice.
func Register(open Opener, example string, schemes ...string) {
	registry.Register(open, example, schemes...)
}

// Schemes lists the URL forms of the registered drivers.
func Schemes() string { return registry.Schemes() }

// Open connects to the database a URL names (postgres://, mysql://, sqlite://) with the driver
// registered for its scheme, and returns its store. It checks that the database answers (and is
// recent enough) and says what to do when it does not; it does not migrate (pipeline.Migrate does).
func Open(ctx context.Context, rawURL string, opts OpenOptions) (*DB, error) {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("database URL %q has no scheme: use one of %s", RedactURL(rawURL), Schemes())
	}
	scheme = strings.ToLower(scheme)
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("store: OpenOptions.MaxConns must be positive, got %d", opts.MaxConns)
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = DefaultMaxConns
	}
	open, err := registry.Lookup(scheme)
	if err != nil {
		return nil, err
	}
	var wrong []string
	if opts.SQLDriver != "" && scheme != "postgres" && scheme != "postgresql" {
		wrong = append(wrong, "SQLDriver")
	}
	if opts.MustExist && scheme != "sqlite" {
		wrong = append(wrong, "MustExist")
	}
	if opts.Listener != nil && scheme != "postgres" && scheme != "postgresql" {
		wrong = append(wrong, "Listener")
	}
	if len(wrong) > 0 {
		return nil, fmt.Errorf("options that do not apply to %s://: %s", scheme, strings.Join(wrong, ", "))
	}
	if opts.Listener != nil && opts.PollOnly {
		return nil, errors.New("store: OpenOptions.Listener and OpenOptions.PollOnly are both set: a poll-only store listens to nothing; drop one")
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return open(pctx, rawURL, opts)
}

// Finish is the end of an Opener for a database/sql handle: it closes db when err is set, checks
// that the database answers and passes check (a version check, say), and returns the DB. Every
// failure closes db and names the URL without its password.
func Finish(ctx context.Context, db *sql.DB, s Driver[*sql.Tx], err error, dialect, rawURL string,
	check func(context.Context) error) (*DB, error) {
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		if c, ok := s.(interface{ Classify(error) error }); ok {
			err = c.Classify(err)
		}
		if outboxkit.IsAccessDenied(err) {
			return nil, fmt.Errorf("the database at %s refused the connection: %w (are the user and password right? may the user connect?)",
				RedactURL(rawURL), err)
		}
		return nil, fmt.Errorf("cannot reach the database at %s: %w (is it running? is the URL right?)", RedactURL(rawURL), err)
	}
	if check != nil {
		if err := check(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("database at %s: %w", RedactURL(rawURL), err)
		}
	}
	return &DB{Driver: s, SQL: db, Dialect: dialect}, nil
}

// RedactURL hides the password of a URL, for messages and logs.
func RedactURL(raw string) string { return urls.Redact(raw) }

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
