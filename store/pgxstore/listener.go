package pgxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/pg"
)

// Listener is one LISTEN connection to a database shared by the relays of many stores on it, one
// store per schema: a process relaying 200 schemas of one database holds one wake-up connection
// instead of 200. A store uses it when Config.Listener (pgsqlstore.Config.Listener,
// store.OpenOptions.Listener) names it.
//
// The connection is open while at least one relay listens through it, LISTENs on the channel of
// each schema whose relays listen, and wakes only the relays of the schema a notification names.
// When it fails, it is opened again after ListenerConfig.Retry, and every relay is told that it
// listens again (its store.Waker's listening callback), since notifications sent meanwhile are
// lost: relays then look for rows at once. Every store using a Listener must be on the database it
// connects to: a store of another database would never be woken, and would rely on its poll.
//
// A Listener is safe for concurrent use. Close it once its relays have stopped.
type Listener struct {
	hub *pg.Hub
}

// ListenerConfig configures a Listener. The zero value is ready to use.
type ListenerConfig struct {
	// Retry is the wait before the connection is opened again after it failed, or could not be
	// opened. Default 2s.
	Retry time.Duration
}

// ErrListenerClosed is reported to relays that listen through a closed Listener: they poll.
var ErrListenerClosed = pg.ErrHubClosed

// DefaultListenerName is the application_name of a Listener's connection when its connection
// string sets none: what pg_stat_activity shows of it.
const DefaultListenerName = "outboxkit-listen"

// NewListener returns a Listener on the database connString names (a postgres:// URL or pgx's
// key=value settings, as pgx.ParseConfig reads them). Its connection's application_name is the
// connection string's, or DefaultListenerName. It does not connect until a relay listens; failures
// to connect are reported to the listening relays and retried. Close stops it.
func NewListener(connString string, cfg ListenerConfig) (*Listener, error) {
	if cfg.Retry < 0 {
		return nil, fmt.Errorf("pgxstore: ListenerConfig.Retry is %s: it must be positive (default 2s when 0)", cfg.Retry)
	}
	cc, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: listener connection string %s: %w", store.RedactURL(connString), err)
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = DefaultListenerName
	}
	connect := func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cc.Copy()) }
	return &Listener{hub: pg.NewHub(connect, cfg.Retry)}, nil
}

// WakerFor returns the store.Waker of the relays of schema, through the shared connection. A
// store given the Listener calls it; it is store.SharedListener's.
func (l *Listener) WakerFor(schema string) store.Waker {
	return l.hub.Waker(pg.Name(schema).NotifyChannel())
}

// Close closes the connection and stops the Listener's goroutine, and returns once both are done.
// Relays still listening through it are told (ErrListenerClosed, to their store.Waker's logErr)
// and poll. It is safe to call more than once.
func (l *Listener) Close() { l.hub.Close() }

var _ store.SharedListener = (*Listener)(nil)
