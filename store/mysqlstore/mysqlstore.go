// Package mysqlstore is outboxkit's store on MySQL 8 and MariaDB ≥ 10.6, through database/sql and
// go-sql-driver/mysql; the application's transactions are *sql.Tx.
//
// Rows are claimed with FOR UPDATE SKIP LOCKED in a read-committed transaction the pass holds; a
// message's deliveries are serialized by GET_LOCK on the delivery's connection; MySQL has no
// NOTIFY, so relays poll the pending rows' index (every 100ms unless told otherwise). outboxkit's
// tables live in a database of their own ("outboxkit" by default) on the same server, which the
// application's transactions reach like any other.
//
// The connection must not set clientFoundRows (the inbox reads "0 rows affected" as a duplicate);
// Open builds a suitable DSN from a mysql:// URL.
package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/mysql"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Schema is the database holding outboxkit's tables (MySQL calls a database a schema;
	// Migrate creates it). Default "outboxkit".
	Schema string
}

// Store is a store.Driver[*sql.Tx].
type Store struct {
	*sqlstore.Store
	db      *sql.DB
	dialect *mysql.Dialect
}

var _ store.Driver[*sql.Tx] = (*Store)(nil)

// New returns the store of the server db reaches. It does not touch the database.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("mysqlstore: db is nil: open the database (sql.Open(\"mysql\", dsn), or mysqlstore.Open) and pass it")
	}
	d, err := mysql.New(cfg.Schema)
	if err != nil {
		return nil, err
	}
	return &Store{Store: sqlstore.New(dbexec.WithNumbered(dbexec.Std(db)), d), db: db, dialect: d}, nil
}

// UnwrapTx is the store's view of the application's transaction.
func (s *Store) UnwrapTx(tx *sql.Tx) store.Tx {
	return s.Store.UnwrapTx(dbexec.WithNumberedTx(dbexec.StdTx(tx)))
}

// DB is the pool the store uses.
func (s *Store) DB() *sql.DB { return s.db }

// CheckVersion refuses a server without FOR UPDATE SKIP LOCKED (MySQL before 8.0.1, MariaDB
// before 10.6) with the version it needs. Migrate checks it too.
func (s *Store) CheckVersion(ctx context.Context) error {
	return s.dialect.CheckVersion(ctx, dbexec.Std(s.db))
}

// DSN turns mysql://user:pass@host:port/db?param=value into go-sql-driver's DSN, with what
// the store needs: no clientFoundRows (the inbox reads "0 rows affected" as a duplicate). Open the
// database/sql handle with sql.Open("mysql", dsn).
func DSN(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("database URL %s: %w (want mysql://user:pass@host:3306/db)", redactURL(rawURL), err)
	}
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", fmt.Errorf("database URL %s names no database: use mysql://user:pass@host:3306/db", redactURL(rawURL))
	}
	cfg.Params = map[string]string{}
	for k, vs := range u.Query() {
		if k == "clientFoundRows" {
			return "", errors.New("database URL: clientFoundRows must stay off: the inbox reads \"0 rows affected\" as a duplicate")
		}
		cfg.Params[k] = vs[len(vs)-1]
	}
	return cfg.FormatDSN(), nil
}

func redactURL(raw string) string { return store.RedactURL(raw) }

func init() {
	store.Register(open, "mysql://user:pass@host:3306/db (MySQL 8, MariaDB 10.6+)", "mysql")
}

// Open connects to the server a mysql:// URL names and returns its store, with its database/sql
// handle; it checks that the server answers and supports what the store needs (FOR UPDATE SKIP
// LOCKED). It does not migrate. store.Open calls it for mysql:// URLs.
func Open(ctx context.Context, rawURL string, opts store.OpenOptions) (*store.DB, error) {
	if scheme, _, _ := strings.Cut(rawURL, "://"); !strings.EqualFold(scheme, "mysql") {
		return nil, fmt.Errorf("mysqlstore: database URL %q is not a mysql:// URL", redactURL(rawURL))
	}
	return store.Open(ctx, rawURL, opts)
}

func open(ctx context.Context, rawURL string, opts store.OpenOptions) (*store.DB, error) {
	dsn, err := DSN(rawURL)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", redactURL(rawURL), err)
	}
	db.SetMaxOpenConns(opts.MaxConns)
	s, err := New(db, Config{Schema: opts.Schema})
	var check func(context.Context) error
	if err == nil {
		check = s.CheckVersion
	}
	return store.Finish(ctx, db, s, err, "mysql", rawURL, check)
}
