package prom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/store"
)

// FleetMetrics exports a relay fleet as its coordination database tells it (fleet.ReadStatus), read
// at scrape time, so that any process reaching that database exports the fleet's view: a member,
// outboxctl, or a sidecar. The fleet label is on every series:
//
//	outboxkit_fleet_coordination_up                           1 when the coordination database answered the scrape's read, 0 when it did not
//	outboxkit_fleet_members                                   live members
//	outboxkit_fleet_member_owned{member}                      outboxes each live member holds a lease on
//	outboxkit_fleet_outboxes{state}                           outboxes of the catalog by state: owned, unowned, disabled
//	outboxkit_fleet_outbox_owned{outbox,tenant,owner}         1 while owner holds the outbox's lease; 0, with owner "", while nobody does
//	outboxkit_fleet_outbox_unowned_seconds{outbox,tenant}     how long an enabled outbox has had no owner (0 while owned or disabled)
//	outboxkit_fleet_outbox_owner_stale{outbox,tenant}         1 when its owner's renewal, or the owner's heartbeat, is overdue
//	outboxkit_fleet_outbox_lease_age_seconds{outbox,tenant}   how long the owner has held it (0 when unowned)
//	outboxkit_fleet_outbox_lease_token{outbox,tenant}         its fencing token (the last one given, when unowned)
//	outboxkit_fleet_outbox_error{outbox,tenant}               1 when the owner's last attempt to open or read it failed
//	outboxkit_fleet_outbox_pending, _oldest_pending_age_seconds{outbox,tenant}
//	                                                          its backlog as the owner last read it (absent until an owner has)
//	outboxkit_fleet_outbox_stats_age_seconds{outbox,tenant}   how old that reading is
//
// Every outbox of the catalog has one series of each (the backlog's once read), so the series grow
// with the outboxes, a few per outbox; outbox_owned's owner label changes when the outbox moves.
//
// A scrape costs one fleet.ReadStatus (three queries), bounded by a timeout of 5s. Scrapes within a
// second of a read share it, so that two Prometheus servers, or a member's and a sidecar's
// registries, do not double the load; concurrent scrapes wait for one read.
//
// When the coordination database cannot be read, the scrape exports outboxkit_fleet_coordination_up
// 0 and nothing else for the fleet: no figure rather than an old one taken for the present (an
// owner shown that may have lost its lease since). The alert on coordination_up says so; the alerts
// on outboxes stay quiet meanwhile rather than fire on figures nobody read.
type FleetMetrics struct {
	fc    store.FleetControl
	fleet string
	descs fleetDescs

	// now and cacheFor decide when a read may be shared; timeout bounds one.
	now      func() time.Time
	cacheFor time.Duration
	timeout  time.Duration

	mu     sync.Mutex // held across a read, so concurrent scrapes share it
	readAt time.Time
	status fleet.Status
	err    error
}

var _ prometheus.Collector = (*FleetMetrics)(nil)

// NewFleetMetrics returns the collector of fleet's series, read from fc, the fleet's coordination
// database (store.FleetControlOf of the store opened on it). Register it in the registry that
// serves /metrics; collectors of several fleets may share a registry, and registering a second
// one for the same fleet fails as a duplicate.
func NewFleetMetrics(fc store.FleetControl, fleetName string) (*FleetMetrics, error) {
	if fc == nil {
		return nil, errors.New("prom: NewFleetMetrics needs the coordination database: pass store.FleetControlOf(st) of the store opened on it")
	}
	if fleetName == "" {
		return nil, errors.New("prom: NewFleetMetrics needs the fleet's name, the one its members are given")
	}
	return &FleetMetrics{fc: fc, fleet: fleetName, descs: newFleetDescs(fleetName),
		now: time.Now, cacheFor: time.Second, timeout: scrapeTimeout}, nil
}

type fleetDescs struct {
	up, members, memberOwned, outboxes                               *prometheus.Desc
	owned, unowned, stale, leaseAge, token, failing, pending, oldest *prometheus.Desc
	statsAge                                                         *prometheus.Desc
}

func newFleetDescs(fleetName string) fleetDescs {
	fl := prometheus.Labels{"fleet": fleetName}
	ob := []string{"outbox", "tenant"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("outboxkit_fleet_"+name, help, labels, fl)
	}
	return fleetDescs{
		up:          d("coordination_up", "1 when the fleet's coordination database answered the scrape's read, 0 when it did not (then no other fleet series is exported).", nil),
		members:     d("members", "Live members of the fleet: their heartbeat has not expired.", nil),
		memberOwned: d("member_owned", "Outboxes a live member holds a lease on.", []string{"member"}),
		outboxes:    d("outboxes", "Outboxes of the fleet's catalog by state: owned, unowned (enabled and relayed by nobody), disabled.", []string{"state"}),
		owned:       d("outbox_owned", "1 while owner holds the outbox's lease; 0, with owner \"\", while nobody does.", []string{"outbox", "tenant", "owner"}),
		unowned:     d("outbox_unowned_seconds", "How long an enabled outbox has had no owner; 0 while owned or disabled.", ob),
		stale:       d("outbox_owner_stale", "1 when the outbox's owner has not renewed its lease, or its heartbeat, within the lease's term.", ob),
		leaseAge:    d("outbox_lease_age_seconds", "How long the outbox's owner has held its lease; 0 when unowned.", ob),
		token:       d("outbox_lease_token", "The outbox's fencing token: one more at each change of owner (the last one given, when unowned).", ob),
		failing:     d("outbox_error", "1 when the owner's last attempt to open or read the outbox failed.", ob),
		pending:     d("outbox_pending", "Outbox rows waiting to be published, as the outbox's owner last read them.", ob),
		oldest:      d("outbox_oldest_pending_age_seconds", "Age of the oldest outbox row waiting to be published, as the outbox's owner last read it.", ob),
		statsAge:    d("outbox_stats_age_seconds", "How old the owner's last reading of the outbox's backlog is.", ob),
	}
}

// Describe sends the fleet's descriptions.
func (m *FleetMetrics) Describe(ch chan<- *prometheus.Desc) {
	d := m.descs
	for _, desc := range []*prometheus.Desc{d.up, d.members, d.memberOwned, d.outboxes, d.owned, d.unowned, d.stale,
		d.leaseAge, d.token, d.failing, d.pending, d.oldest, d.statsAge} {
		ch <- desc
	}
}

// Collect reads the fleet's status, or shares a read less than a second old, and sends its series.
func (m *FleetMetrics) Collect(ch chan<- prometheus.Metric) {
	st, err := m.read()
	d := m.descs
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	if err != nil {
		gauge(d.up, 0)
		return
	}
	gauge(d.up, 1)
	gauge(d.members, float64(st.LiveMembers()))
	for _, mb := range st.Members {
		if mb.Live {
			gauge(d.memberOwned, float64(mb.Owned), mb.Name)
		}
	}
	var owned, unowned, disabled int
	for _, o := range st.Outboxes {
		switch {
		case o.Disabled && o.Owner == "":
			disabled++
		case o.Owner == "":
			unowned++
		default:
			owned++
		}
		if o.Owner != "" {
			gauge(d.owned, 1, o.Name, o.Tenant, o.Owner)
		} else {
			gauge(d.owned, 0, o.Name, o.Tenant, "")
		}
		gauge(d.unowned, o.UnownedFor.Seconds(), o.Name, o.Tenant)
		gauge(d.stale, boolValue(o.OwnerStale), o.Name, o.Tenant)
		gauge(d.leaseAge, o.LeaseAge.Seconds(), o.Name, o.Tenant)
		gauge(d.token, float64(o.Token), o.Name, o.Tenant)
		gauge(d.failing, boolValue(o.Error != ""), o.Name, o.Tenant)
		if !o.StatsAt.IsZero() {
			gauge(d.pending, float64(o.Pending), o.Name, o.Tenant)
			gauge(d.oldest, o.OldestPendingAge.Seconds(), o.Name, o.Tenant)
			gauge(d.statsAge, o.StatsAge.Seconds(), o.Name, o.Tenant)
		}
	}
	gauge(d.outboxes, float64(owned), "owned")
	gauge(d.outboxes, float64(unowned), "unowned")
	gauge(d.outboxes, float64(disabled), "disabled")
}

// read returns the last read while it is younger than cacheFor, failed or not, and reads again
// otherwise; the lock makes concurrent scrapes wait for one read rather than each make its own.
func (m *FleetMetrics) read() (fleet.Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if !m.readAt.IsZero() && now.Sub(m.readAt) < m.cacheFor && now.Sub(m.readAt) >= 0 {
		return m.status, m.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
	defer cancel()
	m.status, m.err = fleet.ReadStatus(ctx, m.fc, m.fleet)
	m.readAt = m.now()
	return m.status, m.err
}

func boolValue(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
