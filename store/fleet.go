package store

import (
	"context"
	"errors"
	"time"
)

// FleetControl is what a relay fleet (package fleet) keeps in its coordination database: who is
// in the fleet, which member owns which outbox, and what the members see of each outbox. Every
// time is the database's clock, never a member's, so members whose clocks disagree still agree on
// who holds a lease. It is implemented by every store driver; FleetControlOf finds it.
//
// A lease carries a fencing token that only grows: each time an outbox passes to a member that did
// not hold it (from nobody, from a member that released it, or from one whose lease expired), its
// token is one more than the last one ever given for that outbox. The token travels in the
// metadata of every message the owner publishes, so a publish by a stale owner is visible
// downstream: its token is lower than the one already seen for that outbox.
type FleetControl interface {
	// FleetHeartbeat records that member belongs to fleet and is alive for ttl from now, with
	// what it says of itself, forgets members whose heartbeat expired a day ago, and returns the
	// database's clock.
	FleetHeartbeat(ctx context.Context, fleet string, m FleetMember, ttl time.Duration) (time.Time, error)
	// FleetMembers lists the fleet's members, live and expired, by name, with the database's clock.
	FleetMembers(ctx context.Context, fleet string) ([]FleetMember, time.Time, error)
	// LeaveFleet forgets member and frees every lease it holds (the next owner's token is still one
	// more than its own).
	LeaveFleet(ctx context.Context, fleet, member string) error

	// AcquireLease gives outbox to member for ttl when nobody holds it, its holder released it or
	// let it expire, or member holds it already (then it is renewed, same token). ok is false, and
	// the lease returned is the holder's, when another member holds it.
	AcquireLease(ctx context.Context, fleet, outbox, member string, ttl time.Duration) (l Lease, ok bool, err error)
	// RenewLeases extends for ttl every lease in held that member still holds with the same token,
	// and returns those it extended; a lease missing from the answer was lost (expired and taken),
	// and its holder must stop publishing for that outbox at once.
	RenewLeases(ctx context.Context, fleet, member string, held []Lease, ttl time.Duration) ([]Lease, error)
	// ReleaseLease frees outbox if member holds it with token; it does nothing otherwise.
	ReleaseLease(ctx context.Context, fleet, outbox, member string, token int64) error
	// FleetLeases lists the fleet's leases, held, released and expired, by outbox, with the
	// database's clock.
	FleetLeases(ctx context.Context, fleet string) ([]Lease, time.Time, error)

	// RecordFleetOutboxes records what member sees of the outboxes in its catalog (every member
	// records the whole catalog, so an outbox nobody owns is still known) and forgets the outboxes
	// that no member has recorded for forgetAfter. An outbox's backlog fields (Pending,
	// OldestPendingAge, StatsAt, Error) are written only where StatsAt is set, so that a member
	// recording an outbox it does not own leaves its owner's reading in place.
	RecordFleetOutboxes(ctx context.Context, fleet, member string, outboxes []FleetOutbox, forgetAfter time.Duration) error
	// FleetOutboxes lists the outboxes the fleet's members recorded, by name, with the latest
	// record of each and the database's clock.
	FleetOutboxes(ctx context.Context, fleet string) ([]FleetOutbox, time.Time, error)
}

// FleetMember is a member of a relay fleet as it last reported itself.
type FleetMember struct {
	Name    string    `json:"name"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Owned is how many outboxes it relayed at its last heartbeat.
	Owned int `json:"owned"`
	// HeartbeatAt and ExpiresAt are the database's clock at its last heartbeat, and when it
	// will be taken for dead without another.
	HeartbeatAt time.Time `json:"heartbeat_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Lease is one outbox's ownership.
type Lease struct {
	Outbox string `json:"outbox"`
	// Owner is the member that holds or last held it; "" once released.
	Owner string `json:"owner"`
	// Token is the fencing token: one more at each change of owner, never reused.
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Held reports whether the lease has an owner at now (the database's clock).
func (l Lease) Held(now time.Time) bool { return l.Owner != "" && now.Before(l.ExpiresAt) }

// FleetOutbox is one outbox of a fleet's catalog as a member last recorded it.
type FleetOutbox struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	// Disabled outboxes are known and relayed by nobody.
	Disabled bool `json:"disabled"`
	// RecordedBy and RecordedAt: the member that last recorded it, and when (the database's clock).
	RecordedBy string    `json:"recorded_by"`
	RecordedAt time.Time `json:"recorded_at"`
	// FirstRecordedAt is when a member first recorded it (since it was last forgotten).
	FirstRecordedAt time.Time `json:"first_recorded_at"`
	// Backlog, as last read by its owner: rows pending, and the age of the oldest (0 when none);
	// StatsAt is zero when no owner ever read it. Error is the owner's last failure to open or
	// read it, "" when none.
	Pending          int64         `json:"pending"`
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
	StatsAt          time.Time     `json:"stats_at,omitzero"`
	Error            string        `json:"error,omitempty"`
}

// ErrNoFleetControl is returned for a store whose driver keeps no fleet.
var ErrNoFleetControl = errors.New("this store cannot coordinate a relay fleet: use Postgres, MySQL or SQLite through outboxkit's drivers")

// FleetControlOf is ConsoleOf for FleetControl, which a relay fleet uses.
func FleetControlOf(s Store) (FleetControl, bool) {
	if d, ok := s.(*DB); ok {
		s = d.Driver
	}
	c, ok := s.(FleetControl)
	return c, ok
}
