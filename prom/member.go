package prom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/forwarder"
)

// MemberMetrics exports what one member of a relay fleet does: pass it as fleet.Config.Metrics,
// and its Forwarder method as fleet.Config.ForwarderMetrics.
//
//	outboxkit_fleet_member_leases_acquired_total   leases the member acquired (it began to relay the outbox)
//	outboxkit_fleet_member_leases_released_total   leases it freed (handed over, or the outbox disabled or removed)
//	outboxkit_fleet_member_leases_lost_total       leases it lost: taken by another member, or not renewed in time
//	outboxkit_fleet_member_relay_failures_total    failures to open an outbox or of its relay (each is tried again)
//
// and, for each outbox it relays, its forwarder's series (NewForwarderMetrics's, labelled
// forwarder=the outbox's name) without the outboxkit_outbox_* backlog: NewFleetMetrics exports
// every outbox's backlog from the coordination database, and a member exports none for an outbox
// it no longer relays. The counters of an outbox the member relayed go on where they were when it
// relays it again; its circuit_state is removed when its lease is released or lost, so that an
// outbox relayed elsewhere does not stay open here.
type MemberMetrics struct {
	reg                              prometheus.Registerer
	acquired, released, lost, failed prometheus.Counter

	mu         sync.Mutex
	forwarders map[string]*ForwarderMetrics // by outbox: the last made
}

var _ fleet.Metrics = (*MemberMetrics)(nil)

// NewMemberMetrics registers a member's counters in reg (nil: prometheus.DefaultRegisterer). A
// second MemberMetrics on one registry shares the first one's counters.
func NewMemberMetrics(reg prometheus.Registerer) (*MemberMetrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "outboxkit", Subsystem: "fleet_member", Name: name, Help: help})
	}
	m := &MemberMetrics{reg: reg, forwarders: map[string]*ForwarderMetrics{},
		acquired: c("leases_acquired_total", "Leases the member acquired: it began to relay the outbox."),
		released: c("leases_released_total", "Leases the member freed: the outbox handed over to another member, disabled or removed from the catalog."),
		lost:     c("leases_lost_total", "Leases the member lost without freeing them: taken by another member, or not renewed in time."),
		failed:   c("relay_failures_total", "Failures to open an outbox the member holds, or of its relay; each is tried again."),
	}
	var err error
	register(reg, &m.acquired, &err)
	register(reg, &m.released, &err)
	register(reg, &m.lost, &err)
	register(reg, &m.failed, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Forwarder returns the metrics of outbox's forwarder, for fleet.Config.ForwarderMetrics.
func (m *MemberMetrics) Forwarder(outbox string) forwarder.Metrics {
	f := &ForwarderMetrics{reg: m.reg, noBacklog: true}
	m.mu.Lock()
	m.forwarders[outbox] = f
	m.mu.Unlock()
	return f
}

// LeaseAcquired counts an acquired lease.
func (m *MemberMetrics) LeaseAcquired(string, int64) { m.acquired.Inc() }

// LeaseReleased counts a freed lease and removes the outbox's circuit state.
func (m *MemberMetrics) LeaseReleased(outbox string) {
	m.released.Inc()
	m.forget(outbox)
}

// LeaseLost counts a lost lease and removes the outbox's circuit state.
func (m *MemberMetrics) LeaseLost(outbox, _ string) {
	m.lost.Inc()
	m.forget(outbox)
}

// RelayFailed counts a failure to open or relay an outbox.
func (m *MemberMetrics) RelayFailed(string, error) { m.failed.Inc() }

func (m *MemberMetrics) forget(outbox string) {
	m.mu.Lock()
	f := m.forwarders[outbox]
	delete(m.forwarders, outbox)
	m.mu.Unlock()
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.attached {
		m.reg.Unregister(f.circuit)
	}
}
