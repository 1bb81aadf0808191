// Package pglog is the log relay: a source for the forwarder that reads the outbox's events from
// Postgres's write-ahead log through a logical replication slot (the pgoutput plugin) instead of
// claiming rows. Events arrive in commit order, with no claim query, no UPDATE per event and no
// polling; they go through the forwarder's publish path (the Relay is a forwarder.Source, run by
// forwarder.RunSource: the broker circuit, backoff, dead-lettering, pauses, heartbeat, metrics,
// tracing), so a broker sees the same messages as from the polling relay. Each event is
// published as soon as it is decoded, unless an earlier event of its partition key is still in
// flight or waiting: a key's events go one at a time, in commit order.
//
// The relay creates, once per relay group (the forwarder's Name), a publication of the outbox's
// INSERTs and a replication slot, and keeps them across restarts: a relay never starts from the
// server's current position for an existing group, so events committed while it was down arrive.
// Progress is the slot's confirmed position: the relay confirms to the server only positions below
// which every event is published, and removes the published outbox rows behind it in bulk (one
// DELETE per batch, with a checkpoint row in the same statement). A lost slot (dropped, or
// invalidated past max_slot_wal_keep_size) is detected at start: the rows left in the outbox are
// exactly the events the relay may not have published, so it backfills them from the table, in a
// snapshot taken with the new slot, and then follows the log.
//
// With the forwarder's ParkKeyOnDeadLetter, a key's events after its dead letter are left in the
// outbox (in ModeWAL written there) while the slot moves on, and read back from the table, in seq
// order behind the dead letter, once it is replayed or archived.
//
// One relay reads a slot at a time (the server refuses a second reader); others wait as standbys
// and take over within StandbyRetry of the active one's connection closing.
//
// With a transactional publisher (forwarder.TransactionalPublisher: the Kafka backend with a
// transactional_id) the relay publishes exactly once for consumers that read only committed
// records: each checkpoint first commits the broker transaction holding the rows published since
// the last one, with a progress record saying which rows the broker has that a restart could read
// again, and only then removes them and records the position. A relay that takes the group over
// fences its predecessor (whose Run then returns an error marked outboxkit.Fenced), and skips
// what the broker committed instead of publishing it again; what an unfinished transaction
// published was never visible and goes again. The checkpoint's FlushInterval is then the most an
// event waits to become visible.
//
// The server needs wal_level = logical, a free replication slot and a role with the REPLICATION
// attribute; Run checks each at start and says what to do.
package pglog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/internal/pgsql"
)

// ErrSlotLost is returned by Run in ModeWAL when the relay group's slot is gone (dropped, or
// invalidated past max_slot_wal_keep_size) after the relay read from it: the events it held
// cannot be read again.
var ErrSlotLost = errors.New("the replication slot of a relay in WAL mode is lost, and with it the events written to the log since its last confirmed position")

// Relay reads the outbox from a replication slot and publishes it. Run may run once at a time.
type Relay struct {
	cfg    Config
	fcfg   forwarder.Config
	schema string
	sql    *pgsql.LogRelay // the statements, rendered for schema
	log    watermill.LoggerAdapter
	fields watermill.LogFields

	running  atomic.Bool
	active   atomic.Bool  // reading the slot now
	slotLost atomic.Bool  // in WAL mode, the slot was found lost and Run stopped
	parked   atomic.Int64 // keys whose oldest event backs off, as of the dispatcher's last look
	held     atomic.Int64 // events a pause holds (of a paused topic or behind one of their key; all, the relay paused)
	hooks    hooks

	mu       sync.Mutex
	activeCh chan struct{} // closed when the relay starts reading the slot; replaced when it stops
}

// hooks let tests provoke faults. They are nil in production.
type hooks struct {
	// crash makes Run return at ctx's end without its last flush and acknowledgement, as a
	// killed process would.
	crash bool
	// hideRows makes that many flushes remove no row, as a snapshot that does not see them yet.
	hideRows int
	// checks counts the dispatcher's reads of the parked keys, for tests that wait on them.
	checks atomic.Int64
	// beforeConfirm runs in each flush that has something to do, before it removes or confirms
	// anything (faults.InjectBeforeConfirm); an error fails the flush there.
	beforeConfirm func() error
	// afterCommit runs after each transaction the relay commits, before its checkpoint; with
	// crash, once it ended Run's context the relay stops there, as a killed process would.
	afterCommit func()
}

func init() {
	faults.RegisterBeforeConfirm(func(r any, fn func() error) bool {
		lr, ok := r.(*Relay)
		if ok {
			lr.hooks.beforeConfirm = fn
		}
		return ok
	})
}

// New validates cfg and builds a Relay. It does not touch the database.
func New(cfg Config) (*Relay, error) {
	var errs []error
	if cfg.Forwarder == nil {
		errs = append(errs, errors.New("field Forwarder is required: build one with forwarder.New (its Publisher receives the events)"))
	}
	if cfg.Pool == nil {
		errs = append(errs, errors.New("field Pool is required: a pgxpool.Pool on the database holding the outbox"))
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeTable
	}
	if cfg.Mode != ModeTable && cfg.Mode != ModeWAL {
		errs = append(errs, fmt.Errorf("field Mode: unknown mode %q (known: %q, %q)", cfg.Mode, ModeTable, ModeWAL))
	}
	def := func(d *time.Duration, v time.Duration, field string) {
		if *d == 0 {
			*d = v
		}
		if *d < 0 {
			errs = append(errs, fmt.Errorf("field %s must be positive, got %s", field, *d))
		}
	}
	def(&cfg.StandbyRetry, DefaultStandbyRetry, "StandbyRetry")
	def(&cfg.StatusInterval, DefaultStatusInterval, "StatusInterval")
	def(&cfg.FlushInterval, DefaultFlushInterval, "FlushInterval")
	if cfg.FlushRows == 0 {
		cfg.FlushRows = DefaultFlushRows
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.FlushRows < 1 || cfg.Window < 1 {
		errs = append(errs, fmt.Errorf("fields FlushRows and Window must be at least 1, got %d and %d", cfg.FlushRows, cfg.Window))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pglog config: %w", err)
	}
	fcfg := cfg.Forwarder.Config()
	r := &Relay{cfg: cfg, fcfg: fcfg, schema: fcfg.Store.Info().Schema, log: fcfg.Logger,
		activeCh: make(chan struct{})}
	if r.schema == "" {
		r.schema = "outboxkit"
	}
	r.sql = pgsql.NewLogRelay(r.schema)
	base := slotIdent("outboxkit_" + r.schema + "_" + fcfg.Name)
	if len("outboxkit_"+r.schema+"_"+fcfg.Name) > 63 {
		// Too long for a name: keep its start, and a hash of the whole so that names stay apart.
		sum := sha256.Sum256([]byte(r.schema + "\x00" + fcfg.Name))
		base = base[:50] + "_" + hex.EncodeToString(sum[:6])
	}
	if cfg.SlotName == "" {
		r.cfg.SlotName = base
	}
	if cfg.PublicationName == "" {
		r.cfg.PublicationName = base
	}
	if r.cfg.SlotName != slotIdent(r.cfg.SlotName) {
		return nil, fmt.Errorf("pglog config: field SlotName %q: a slot name has only lowercase letters, digits and underscores, at most 63", r.cfg.SlotName)
	}
	r.fields = watermill.LogFields{"relay": fcfg.Name, "slot": r.cfg.SlotName}
	return r, nil
}

// slotIdent turns s into a valid replication slot name: lowercase letters, digits and
// underscores, at most 63 bytes.
func slotIdent(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
		if b.Len() >= 63 {
			break
		}
	}
	return b.String()
}

// SlotName is the replication slot the relay reads.
func (r *Relay) SlotName() string { return r.cfg.SlotName }

// Active reports whether the relay reads its slot now (false while it waits as a standby).
func (r *Relay) Active() bool { return r.active.Load() }

// Reading returns a channel closed once the relay reads its slot (after a backfill, if any): from
// then on events committed arrive. After the relay loses the slot, a new channel is returned.
func (r *Relay) Reading() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.activeCh
}

func (r *Relay) setActive(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active.Swap(on) == on {
		return
	}
	if on {
		close(r.activeCh)
	} else {
		r.activeCh = make(chan struct{})
	}
}

// Run relays until ctx ends, then flushes what it published, confirms it to the server and returns
// nil once every goroutine it started has stopped.
//
// It checks the server at start and returns an error saying what to do when the relay cannot
// work there: wal_level not logical, a role without REPLICATION, no free replication slot, a
// publication altered by hand, a slot made for something else, the outbox not migrated. Lost
// connections and broker outages never end it: it reconnects with the forwarder's
// CircuitBackoff and reads again from the slot's confirmed position (events published but not yet
// confirmed are published again: a duplicate, never a loss). While another relay reads the slot
// it waits as a standby.
//
// It runs through its Forwarder's RunSource, which reads the pauses and reports the relay (the
// console lists it) every HeartbeatInterval from the start; so it may not run at once with the
// Forwarder's Run or another source's run on it.
func (r *Relay) Run(ctx context.Context) error { return r.cfg.Forwarder.RunSource(ctx, r) }

var _ forwarder.Source = (*Relay)(nil)

// Relay is the log relay as a forwarder.Source: Run hands it to its Forwarder's RunSource, which
// runs the heartbeat beside it, and it does all that Run says with sr as its publish path and
// pauses. Call Run; Relay is exported to implement the interface.
func (r *Relay) Relay(ctx context.Context, sr *forwarder.SourceRelay) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("pglog: Run is already running on this Relay; create another Relay for a standby")
	}
	defer r.running.Store(false)
	if err := r.checkServer(ctx); err != nil {
		return err
	}
	r.log.Info("Log relay starting", r.fields)
	failures := 0
	standby := false
	for {
		err := r.session(ctx, sr)
		r.setActive(false)
		if ctx.Err() != nil {
			r.log.Info("Log relay stopped", r.fields)
			return nil
		}
		var wait time.Duration
		switch {
		case errors.Is(err, errSlotBusy):
			if !standby {
				r.log.Info("Another relay reads the slot: standing by", r.fields)
			}
			standby, failures, wait = true, 0, r.cfg.StandbyRetry
		case isFatal(err):
			return fmt.Errorf("log relay %s: %w", r.fcfg.Name, err)
		default:
			standby = false
			failures++
			wait = r.fcfg.CircuitBackoff.Delay(failures)
			r.log.Error("Log relay session failed, reading again from the slot's confirmed position", err,
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

// fatalError is a condition no retry ends: the relay returns it.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

func fatal(format string, args ...any) error { return fatalError{fmt.Errorf(format, args...)} }

func isFatal(err error) bool {
	var f fatalError
	return errors.As(err, &f)
}

var errSlotBusy = errors.New("the replication slot is read by another relay")
