// Package pgxstore is outboxkit's store on Postgres through pgx v5: a pgxpool.Pool for outboxkit's
// own work, and the application's pgx.Tx for writing events with its business change.
//
// Rows are claimed in one statement with FOR UPDATE SKIP LOCKED and held by the pass's
// transaction; a message's deliveries are serialized by a session advisory lock; writers wake
// relays with pg_notify in the same INSERT as the row, delivered at commit, and a relay listens on
// a connection of its own (Config.PollOnly turns that off for PgBouncer in transaction mode), or on
// a Listener that the stores of many schemas of the database share (Config.Listener).
//
// Store.Transact runs the application's transaction itself and sends the outbox rows in one
// pipeline with its COMMIT: the row then costs the transaction no round trip of its own.
package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec/pgxexec"
	"github.com/outboxkit/outboxkit/store/internal/pg"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Schema is the Postgres schema holding outboxkit's tables. Default "outboxkit".
	Schema string
	// DisableNotify stops writers from waking relays with pg_notify; relays find new rows at
	// their next poll. Postgres serialises the commits of notifying transactions: set it where
	// many concurrent writers matter more than a relay's latency. Default false.
	DisableNotify bool
	// PollOnly opens no LISTEN connection (PgBouncer in transaction mode does not carry
	// notifications): relays poll. Default false.
	PollOnly bool
	// ListenRetry is the wait before the LISTEN connection is opened again after it failed.
	// Default 2s.
	ListenRetry time.Duration
	// Listener, when set, wakes the store's relays through a LISTEN connection shared with the
	// stores of other schemas of the same database (NewListener), instead of one of their own;
	// ListenRetry is then the Listener's (ListenerConfig.Retry). Default nil. Setting it with
	// PollOnly is an error.
	Listener *Listener
	// WAL writes each event as a logical decoding message in the writer's transaction
	// (pg_logical_emit_message(true, 'outboxkit:<schema>', envelope); with Transact, in the
	// COMMIT's round trip) instead of an outbox row: no row, no index entry, nothing to delete.
	// Only the log relay reads them (package forwarder/pglog with Mode pglog.ModeWAL), so writers
	// refuse (ErrNoWALRelay) until it has made its replication slot, and a lost slot loses the
	// events it held: see "Choosing a relay" in the README. Needs Postgres 14 or newer with
	// wal_level = logical. Default false: outbox rows.
	WAL bool
}

// ErrNoWALRelay is returned to writers of a store in WAL mode before a log relay in WAL mode has
// made its replication slot.
var ErrNoWALRelay = pg.ErrNoWALRelay

// Store is a store.Driver[pgx.Tx].
type Store struct {
	*sqlstore.Store
	pool *pgxpool.Pool
	d    *pg.Dialect
}

var _ store.Driver[pgx.Tx] = (*Store)(nil)

// New returns the store of the database pool reaches. It does not touch the database.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgxstore: pool is nil: create one (pgxpool.New, or pgxstore.Open) and pass it")
	}
	pcfg := pg.Config{Schema: cfg.Schema, Driver: "pgx", NativeArrays: true, DisableNotify: cfg.DisableNotify,
		ListenRetry: cfg.ListenRetry, WAL: cfg.WAL}
	switch {
	case cfg.Listener != nil && cfg.PollOnly:
		return nil, errors.New("pgxstore: Config.Listener and Config.PollOnly are both set: a poll-only store listens to nothing; drop one")
	case cfg.Listener != nil:
		pcfg.Listener = cfg.Listener
	case !cfg.PollOnly:
		pcfg.ListenConnect = func(ctx context.Context) (*pgx.Conn, error) {
			c := pool.Config().ConnConfig.Copy()
			if c.RuntimeParams == nil {
				c.RuntimeParams = map[string]string{}
			}
			// Named after the pool's connections so operators can tell whose it is.
			name := strings.TrimPrefix(c.RuntimeParams["application_name"]+"-listen", "-")
			if name == "listen" {
				name = "outboxkit-listen"
			}
			c.RuntimeParams["application_name"] = name
			return pgx.ConnectConfig(ctx, c)
		}
	}
	d, err := pg.New(pcfg)
	if err != nil {
		return nil, err
	}
	return &Store{Store: sqlstore.New(pgxexec.DB(pool), d), pool: pool, d: d}, nil
}

// Open connects a pool of its own to the database a postgres:// URL names (pgx's connection string
// settings apply, pool_max_conns included), checks that it answers, and returns the store on it:
// for a team on pgx that takes its database URL from configuration and wants its handlers and
// writers to receive pgx.Tx. Close the store's Pool when done. It does not migrate.
func Open(ctx context.Context, rawURL string, cfg Config) (*Store, error) {
	pcfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: database URL %s: %w", store.RedactURL(rawURL), err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: database URL %s: %w", store.RedactURL(rawURL), err)
	}
	s, err := New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if err = s.Classify(err); outboxkit.IsAccessDenied(err) {
			return nil, fmt.Errorf("the database at %s refused the connection: %w (are the user and password right? may the user connect?)",
				store.RedactURL(rawURL), err)
		}
		return nil, fmt.Errorf("cannot reach the database at %s: %w (is it running? is the URL right?)", store.RedactURL(rawURL), err)
	}
	return s, nil
}

// UnwrapTx is the store's view of the application's transaction.
func (s *Store) UnwrapTx(tx pgx.Tx) store.Tx { return s.Store.UnwrapTx(pgxexec.Tx(tx)) }

// Pool is the pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }
