package fleet

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// Status is a fleet as its coordination database tells it: who is in it, who owns what, and which
// outboxes have no owner. Any process that reaches the coordination database can read it
// (ReadStatus); a member, outboxctl fleet status and prom.NewFleetMetrics all read this one.
type Status struct {
	Fleet string `json:"fleet"`
	// Now is the coordination database's clock when it was read: every age is measured from it.
	Now     time.Time      `json:"now"`
	Members []MemberStatus `json:"members"`
	// Outboxes are the catalog's outboxes as the members recorded them, by name.
	Outboxes []OutboxStatus `json:"outboxes"`
}

// MemberStatus is one member of the fleet.
type MemberStatus struct {
	store.FleetMember
	// Live is false once its heartbeat has expired: its leases are free to take.
	Live bool `json:"live"`
	// Owned is how many outboxes it holds a lease on now.
	Owned int `json:"owned_now"`
}

// OutboxStatus is one outbox of the fleet.
type OutboxStatus struct {
	store.FleetOutbox
	// Owner is the member that holds its lease now, "" when none does; Token its fencing token
	// (or the last one given, when nobody holds it).
	Owner string `json:"owner"`
	Token int64  `json:"token"`
	// LeaseAge is how long the current owner has held it (0 when unowned); RenewedAgo how long ago
	// the owner last renewed it.
	LeaseAge   time.Duration `json:"lease_age"`
	RenewedAgo time.Duration `json:"renewed_ago"`
	// UnownedFor is how long it has had no owner: since its last lease expired or was released,
	// or since it was first recorded when it never had one. 0 while owned or disabled.
	UnownedFor time.Duration `json:"unowned_for"`
	// OwnerStale: a member holds the lease but has not renewed it, or its own heartbeat, for
	// longer than the lease's term; StatsAge is how old the owner's backlog reading is.
	OwnerStale bool          `json:"owner_stale"`
	StatsAge   time.Duration `json:"stats_age"`
}

// Unowned reports whether the outbox is enabled and nobody relays it.
func (o OutboxStatus) Unowned() bool { return !o.Disabled && o.Owner == "" }

// Unowned lists the enabled outboxes that no member relays.
func (s Status) Unowned() []OutboxStatus {
	var out []OutboxStatus
	for _, o := range s.Outboxes {
		if o.Unowned() {
			out = append(out, o)
		}
	}
	return out
}

// LiveMembers counts the members whose heartbeat has not expired.
func (s Status) LiveMembers() int {
	n := 0
	for _, m := range s.Members {
		if m.Live {
			n++
		}
	}
	return n
}

// ReadStatus reads fleet's status from its coordination database.
func ReadStatus(ctx context.Context, fc store.FleetControl, fleet string) (Status, error) {
	members, _, err := fc.FleetMembers(ctx, fleet)
	if err != nil {
		return Status{}, fmt.Errorf("read the fleet's members: %w", err)
	}
	leases, _, err := fc.FleetLeases(ctx, fleet)
	if err != nil {
		return Status{}, fmt.Errorf("read the fleet's leases: %w", err)
	}
	outboxes, now, err := fc.FleetOutboxes(ctx, fleet)
	if err != nil {
		return Status{}, fmt.Errorf("read the fleet's outboxes: %w", err)
	}
	return BuildStatus(fleet, now, members, leases, outboxes), nil
}

// BuildStatus is ReadStatus on what was read: now is the coordination database's clock.
func BuildStatus(fleet string, now time.Time, members []store.FleetMember, leases []store.Lease, outboxes []store.FleetOutbox) Status {
	st := Status{Fleet: fleet, Now: now}
	memberAt := make(map[string]int, len(members))
	for _, m := range members {
		memberAt[m.Name] = len(st.Members)
		st.Members = append(st.Members, MemberStatus{FleetMember: m, Live: now.Before(m.ExpiresAt)})
	}
	leaseOf := make(map[string]store.Lease, len(leases))
	for _, l := range leases {
		leaseOf[l.Outbox] = l
	}
	for _, ob := range outboxes {
		o := OutboxStatus{FleetOutbox: ob}
		if !ob.StatsAt.IsZero() {
			o.StatsAge = nonNegative(now.Sub(ob.StatsAt))
		}
		l, leased := leaseOf[ob.Name]
		o.Token = l.Token
		switch {
		case leased && l.Held(now):
			o.Owner = l.Owner
			o.LeaseAge = nonNegative(now.Sub(l.AcquiredAt))
			o.RenewedAgo = nonNegative(now.Sub(l.RenewedAt))
			term := l.ExpiresAt.Sub(l.RenewedAt)
			if i, ok := memberAt[l.Owner]; !ok || !st.Members[i].Live || o.RenewedAgo > term {
				o.OwnerStale = true
			} else {
				st.Members[i].Owned++
			}
		case ob.Disabled:
		case leased && !l.ExpiresAt.IsZero():
			// Released or expired: unowned since the lease ended, or since the outbox was first
			// seen if that is later (a lease left from an earlier life of the same name).
			o.UnownedFor = nonNegative(now.Sub(later(l.ExpiresAt, ob.FirstRecordedAt)))
		default:
			o.UnownedFor = nonNegative(now.Sub(ob.FirstRecordedAt))
		}
		st.Outboxes = append(st.Outboxes, o)
	}
	sort.Slice(st.Outboxes, func(i, j int) bool { return st.Outboxes[i].Name < st.Outboxes[j].Name })
	return st
}

func nonNegative(d time.Duration) time.Duration { return max(d, 0) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
