package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultFleet    = "default"
	DefaultLeaseTTL = 10 * time.Second
	DefaultTick     = time.Second

	// DefaultIdlePoll is the forwarder's IdlePollInterval where the outbox's writers wake its relay
	// (Postgres NOTIFY): the poll is a safety net only, so an idle outbox is polled twice a minute.
	DefaultIdlePoll = 30 * time.Second
	// DefaultIdlePollWithoutWake is the forwarder's IdlePollInterval where writers do not wake
	// the relay (MySQL, Postgres without LISTEN, SQLite written by another process): an event
	// written to an idle outbox waits up to this long.
	DefaultIdlePollWithoutWake = 2 * time.Second
	// DefaultRelayHeartbeat is the forwarder's HeartbeatInterval: how often each outbox's relay
	// reads the operator's pauses and reports itself in its database (two statements), the main
	// cost of an idle outbox. A pause is honoured within it; the console calls a relay gone after
	// 15s without one.
	DefaultRelayHeartbeat = 5 * time.Second
)

// Opener opens the store of an outbox its member has just acquired, and says how to relay it.
// It is called once each time the member acquires the outbox (and again, after a pause, when it
// failed), from a goroutine of that outbox's own: a slow or failing Open holds back no other
// outbox. fleetstores.Opener is the usual one.
type Opener func(ctx context.Context, o Outbox) (Opened, error)

// Opened is an outbox's store, opened.
type Opened struct {
	// Store holds the outbox. Required.
	Store store.Store
	// Run relays the outbox with the forwarder the member built on Store, until ctx ends. Default
	// nil: f.Run, the polling relay; the log relay runs pglog.New(…).Run.
	Run func(ctx context.Context, f *forwarder.Forwarder) error
	// Close is called once the outbox's relay has stopped, when its member loses or releases it.
	// Default nil: nothing to close.
	Close func() error
}

// Metrics receives what a member does with its leases. Methods are called from the member's
// goroutines and must not block.
type Metrics interface {
	// LeaseAcquired: the member now relays outbox, with the lease's fencing token.
	LeaseAcquired(outbox string, token int64)
	// LeaseReleased: the member stopped relaying outbox and freed its lease (handed it to
	// another member, or the outbox was disabled or removed from the catalog).
	LeaseReleased(outbox string)
	// LeaseLost: the member stopped relaying outbox without freeing its lease: it was taken, or
	// could not be renewed in time (reason says which).
	LeaseLost(outbox, reason string)
	// RelayFailed: outbox's store could not be opened, or its relay stopped with err; it is tried
	// again.
	RelayFailed(outbox string, err error)
}

type nopMetrics struct{}

func (nopMetrics) LeaseAcquired(string, int64) {}
func (nopMetrics) LeaseReleased(string)        {}
func (nopMetrics) LeaseLost(string, string)    {}
func (nopMetrics) RelayFailed(string, error)   {}

// Config configures a Member. Zero-valued fields take the documented defaults; New rejects values
// that cannot work and names the field.
type Config struct {
	// Fleet names the fleet: members of one fleet share its outboxes. Default "default".
	Fleet string
	// Member names this member, unique in the fleet. Default host-pid-random, new at each start.
	// A fixed name (a StatefulSet pod's) must never be given to two processes at once.
	Member string

	// Coordination is the store of the coordination database holding the fleet's members and
	// leases: any of outboxkit's Postgres, MySQL or SQLite stores (store.FleetControlOf),
	// migrated (pipeline.Migrate). Every member of the fleet uses the same one. Required.
	Coordination store.Store
	// Catalog lists the outboxes to relay. Required.
	Catalog Catalog
	// Open opens an outbox's store (fleetstores.Opener() opens by URL). Required.
	Open Opener
	// Publisher publishes every outbox's messages: one publisher, one pool of broker connections,
	// for all of them. It is called concurrently. Required.
	Publisher message.Publisher
	// Forwarder is the configuration of each outbox's forwarder: its Store, Publisher and Name are
	// set for each outbox (Name is the outbox's). Where it leaves IdlePollInterval at 0, the
	// member sets DefaultIdlePoll when the store's writers wake relays and
	// DefaultIdlePollWithoutWake when they do not; set it to PollInterval to keep every poll.
	// HeartbeatInterval left at 0 is DefaultRelayHeartbeat.
	Forwarder forwarder.Config
	// ForwarderMetrics, when set, gives each forwarder the member builds its metrics (a
	// forwarder.Metrics serves one forwarder): func(string) forwarder.Metrics { return
	// prom.NewForwarderMetrics(reg) }, say. Its argument is the outbox's name. Default: none.
	ForwarderMetrics func(outbox string) forwarder.Metrics

	// LeaseTTL is the term of the member's heartbeat and of its leases: a member that stops
	// renewing is taken for dead, and its outboxes are taken, after it. Default 10s.
	LeaseTTL time.Duration
	// RenewInterval is the time between heartbeats, each renewing every lease the member holds.
	// At most (LeaseTTL-StopBefore)/2, so that one failed renewal stops no relay. Default
	// LeaseTTL/4.
	RenewInterval time.Duration
	// StopBefore is how long before its lease could expire an owner stops publishing, when no
	// renewal has succeeded meanwhile (its coordination database is unreachable, say): the margin
	// for a publish in progress to end before another member can acquire the outbox. Default
	// LeaseTTL/4.
	StopBefore time.Duration
	// Tick is the time between two readings of the catalog and the fleet's members, each
	// acquiring and releasing outboxes as they say. Default 1s.
	Tick time.Duration

	// Logger receives the member's logs. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
	// Metrics receives what the member does with its leases. Default: none.
	Metrics Metrics
}

func (c Config) withDefaults() Config {
	if c.Fleet == "" {
		c.Fleet = DefaultFleet
	}
	if c.Member == "" {
		c.Member = defaultMemberName()
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.LeaseTTL / 4
	}
	if c.StopBefore == 0 {
		c.StopBefore = c.LeaseTTL / 4
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	return c
}

func defaultMemberName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "member"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

func (c Config) validate() (store.FleetControl, error) {
	var errs []error
	var fc store.FleetControl
	if c.Coordination == nil {
		errs = append(errs, errors.New("field Coordination is required: pass the store of the coordination database "+
			"(a Postgres, MySQL or SQLite store, migrated with pipeline.Migrate)"))
	} else if f, ok := store.FleetControlOf(c.Coordination); ok {
		fc = f
	} else {
		errs = append(errs, fmt.Errorf("field Coordination: %w (got %s)", store.ErrNoFleetControl, c.Coordination.Info().Name))
	}
	if c.Catalog == nil {
		errs = append(errs, errors.New("field Catalog is required: list the outboxes (fleet.Outboxes{…}, fleet.TableCatalog)"))
	}
	if fixed, ok := c.Catalog.(Outboxes); ok {
		_, invalid, err := checkCatalog(fixed)
		errs = append(errs, err)
		for _, e := range invalid {
			errs = append(errs, fmt.Errorf("field Catalog: %w", e))
		}
	}
	if c.Open == nil {
		errs = append(errs, errors.New("field Open is required: pass fleetstores.Opener(), or an Opener of your own"))
	}
	if _, ok := c.Publisher.(forwarder.TransactionalPublisher); ok {
		// One transactional id is one relay group: it cannot be shared by every outbox.
		errs = append(errs, errors.New("field Publisher is transactional (a kafka:// URL with transactional_id): a fleet shares one publisher "+
			"between all its outboxes, and a transactional id belongs to one outbox; drop transactional_id, or run that outbox's relay on its own"))
	}
	if c.Publisher == nil {
		errs = append(errs, errors.New("field Publisher is required: pass the broker publisher every outbox publishes to (see package backends)"))
	}
	if c.Forwarder.Store != nil || c.Forwarder.Publisher != nil || c.Forwarder.Name != "" {
		errs = append(errs, errors.New("fields Forwarder.Store, Forwarder.Publisher and Forwarder.Name are set for each outbox: "+
			"leave them empty (the publisher is Config.Publisher)"))
	}
	if c.Forwarder.Metrics != nil {
		errs = append(errs, errors.New("field Forwarder.Metrics would serve every outbox's forwarder, and a forwarder.Metrics serves one: "+
			"set ForwarderMetrics, which makes one for each"))
	}
	positive := func(field string, v time.Duration) bool {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", field, v))
			return false
		}
		return true
	}
	okTTL := positive("LeaseTTL", c.LeaseTTL)
	okRenew := positive("RenewInterval", c.RenewInterval)
	okStop := positive("StopBefore", c.StopBefore)
	positive("Tick", c.Tick)
	if okTTL && okStop && c.StopBefore >= c.LeaseTTL {
		errs = append(errs, fmt.Errorf("StopBefore (%s) must be less than LeaseTTL (%s)", c.StopBefore, c.LeaseTTL))
	} else if okTTL && okRenew && okStop && 2*c.RenewInterval > c.LeaseTTL-c.StopBefore {
		errs = append(errs, fmt.Errorf("RenewInterval (%s) must be at most (LeaseTTL-StopBefore)/2 (%s), so that one failed renewal "+
			"stops no relay: shorten it, or lengthen LeaseTTL", c.RenewInterval, (c.LeaseTTL-c.StopBefore)/2))
	}
	return fc, errors.Join(errs...)
}

// placeholderStore and placeholderPublisher stand in for an outbox's store and publisher while
// New checks the forwarder configuration; nothing calls them but Waker and Info.
type placeholderStore struct{ store.Store }

func (placeholderStore) Waker() store.Waker { return nil }
func (placeholderStore) Info() store.Info   { return store.Info{Name: "placeholder"} }

type placeholderPublisher struct{}

func (placeholderPublisher) Publish(string, ...*message.Message) error { return nil }
func (placeholderPublisher) Close() error                              { return nil }
