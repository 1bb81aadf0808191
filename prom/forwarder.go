package prom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/forwarder"
)

// ForwarderMetrics exports one forwarder's metrics; pass it as forwarder.Config.Metrics. The
// forwarder's Name and its store's schema label every series:
//
//	outboxkit_forwarder_published_total                   rows published and confirmed by the broker
//	outboxkit_forwarder_publish_failures_total{kind}      failed publishes: message (attempt counted) or unreachable
//	outboxkit_forwarder_dead_lettered_total               rows dead-lettered after MaxAttempts
//	outboxkit_forwarder_commit_to_confirm_seconds         from the row's insert to the broker's confirm
//	outboxkit_forwarder_publish_attempts                  publishes a row needed (1: the first)
//	outboxkit_forwarder_circuit_state                     0 closed, 1 open, 2 half-open
//	outboxkit_forwarder_last_pass_timestamp_seconds       the last completed pass
//	outboxkit_forwarder_last_publish_timestamp_seconds    the last pass that published a row
//	outboxkit_forwarder_transactions_total{outcome}       a transactional relay's transactions: committed, aborted, unknown, fenced
//	outboxkit_forwarder_transaction_rows_total{outcome}   their rows
//	outboxkit_forwarder_recovered_rows_total              rows marked from the group's last committed transaction at a relay's start
//	outboxkit_outbox_pending, _oldest_pending_age_seconds, _dead_lettered, _oldest_dead_lettered_age_seconds
//	                                                      the outbox's backlog, read from the store at scrape time
type ForwarderMetrics struct {
	reg prometheus.Registerer
	// noBacklog leaves out the outbox_* series, for a fleet's forwarders (MemberMetrics).
	noBacklog bool

	mu       sync.Mutex
	attached bool

	published, deadLettered prometheus.Counter
	failures                *prometheus.CounterVec
	latency, attempts       prometheus.Histogram
	circuit                 prometheus.Gauge
	lastPass, lastPublish   prometheus.Gauge
	txns, txnRows           *prometheus.CounterVec
	recovered               prometheus.Counter
}

var (
	_ forwarder.Metrics            = (*ForwarderMetrics)(nil)
	_ forwarder.TransactionMetrics = (*ForwarderMetrics)(nil)
)

// NewForwarderMetrics returns the metrics of one forwarder, registered in reg when the forwarder
// is made (forwarder.New fails if they cannot be). A nil reg means prometheus.DefaultRegisterer.
func NewForwarderMetrics(reg prometheus.Registerer) *ForwarderMetrics {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	return &ForwarderMetrics{reg: reg}
}

// Attach registers the series, labelled with f's name and its store's schema. Forwarders with the
// same name and schema in one process share their series.
func (m *ForwarderMetrics) Attach(f *forwarder.Forwarder) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.attached {
		return errors.New("prom: a ForwarderMetrics serves one forwarder: make one per forwarder")
	}
	cfg := f.Config()
	schema := cfg.Store.Info().Schema
	labels := prometheus.Labels{"forwarder": cfg.Name, "schema": schema}
	opts := func(n, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "outboxkit", Subsystem: "forwarder", Name: n, Help: help, ConstLabels: labels}
	}
	m.published = prometheus.NewCounter(prometheus.CounterOpts(opts("published_total",
		"Outbox rows published and confirmed by the broker.")))
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts(opts("publish_failures_total",
		"Failed publishes, by kind: message (attempt counted) or unreachable (broker unreachable, no attempt counted).")), []string{"kind"})
	m.deadLettered = prometheus.NewCounter(prometheus.CounterOpts(opts("dead_lettered_total",
		"Outbox rows dead-lettered after MaxAttempts.")))
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outboxkit", Subsystem: "forwarder", Name: "commit_to_confirm_seconds", ConstLabels: labels,
		Help:    "Time from the outbox row's insert to the broker's confirm.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})
	m.attempts = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outboxkit", Subsystem: "forwarder", Name: "publish_attempts", ConstLabels: labels,
		Help:    "Attempts a row needed to be published (1 = first try).",
		Buckets: []float64{1, 2, 3, 5, 10, 20},
	})
	m.circuit = prometheus.NewGauge(prometheus.GaugeOpts(opts("circuit_state",
		"Broker circuit: 0 closed, 1 open (broker unreachable), 2 half-open (probing).")))
	m.lastPass = prometheus.NewGauge(prometheus.GaugeOpts(opts("last_pass_timestamp_seconds",
		"Unix time of the last completed pass, whether or not it found rows.")))
	m.lastPublish = prometheus.NewGauge(prometheus.GaugeOpts(opts("last_publish_timestamp_seconds",
		"Unix time of the last pass that published at least one row.")))
	m.txns = prometheus.NewCounterVec(prometheus.CounterOpts(opts("transactions_total",
		"A transactional relay's broker transactions, by outcome: committed, aborted, unknown (the commit failed), fenced.")), []string{"outcome"})
	m.txnRows = prometheus.NewCounterVec(prometheus.CounterOpts(opts("transaction_rows_total",
		"Rows of a transactional relay's transactions, by the transaction's outcome.")), []string{"outcome"})
	m.recovered = prometheus.NewCounter(prometheus.CounterOpts(opts("recovered_rows_total",
		"Rows a transactional relay marked published from its group's last committed transaction, which the relay that committed it did not live to mark.")))
	var err error
	register(m.reg, &m.published, &err)
	register(m.reg, &m.failures, &err)
	register(m.reg, &m.deadLettered, &err)
	register(m.reg, &m.latency, &err)
	register(m.reg, &m.attempts, &err)
	register(m.reg, &m.circuit, &err)
	register(m.reg, &m.lastPass, &err)
	register(m.reg, &m.lastPublish, &err)
	if _, ok := cfg.Publisher.(forwarder.TransactionalPublisher); ok {
		register(m.reg, &m.txns, &err)
		register(m.reg, &m.txnRows, &err)
		register(m.reg, &m.recovered, &err)
	}
	if !m.noBacklog {
		var backlog prometheus.Collector = &backlogCollector{f: f, labels: prometheus.Labels{"schema": schema}}
		register(m.reg, &backlog, &err)
	}
	if err != nil {
		return err
	}
	m.failures.WithLabelValues("message")
	m.failures.WithLabelValues("unreachable")
	m.attached = true
	return nil
}

func (m *ForwarderMetrics) Published(sinceCommit time.Duration, attempts int) {
	m.published.Inc()
	m.latency.Observe(sinceCommit.Seconds())
	m.attempts.Observe(float64(attempts))
}

func (m *ForwarderMetrics) PublishFailed(unreachable bool) {
	kind := "message"
	if unreachable {
		kind = "unreachable"
	}
	m.failures.WithLabelValues(kind).Inc()
}

func (m *ForwarderMetrics) DeadLettered(rows int) { m.deadLettered.Add(float64(rows)) }

func (m *ForwarderMetrics) PassDone(at time.Time, published bool) {
	now := float64(at.UnixNano()) / 1e9
	m.lastPass.Set(now)
	if published {
		m.lastPublish.Set(now)
	}
}

func (m *ForwarderMetrics) TransactionEnded(outcome string, rows int) {
	m.txns.WithLabelValues(outcome).Inc()
	m.txnRows.WithLabelValues(outcome).Add(float64(rows))
}

func (m *ForwarderMetrics) Recovered(rows int) { m.recovered.Add(float64(rows)) }

func (m *ForwarderMetrics) CircuitChanged(state forwarder.CircuitState) {
	m.circuit.Set(float64(state))
}

// backlogCollector exports the forwarder's Stats at scrape time.
type backlogCollector struct {
	f      *forwarder.Forwarder
	labels prometheus.Labels
}

var backlogDescs = map[string]string{
	"pending":                          "Outbox rows waiting to be published.",
	"oldest_pending_age_seconds":       "Age of the oldest outbox row waiting to be published.",
	"dead_lettered":                    "Outbox rows dead-lettered, waiting for an operator's replay.",
	"oldest_dead_lettered_age_seconds": "Time since the oldest outbox dead letter was parked.",
}

func (b *backlogCollector) desc(name string) *prometheus.Desc {
	return prometheus.NewDesc("outboxkit_outbox_"+name, backlogDescs[name], nil, b.labels)
}

func (b *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for name := range backlogDescs {
		ch <- b.desc(name)
	}
}

func (b *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	s, err := b.f.Stats(ctx)
	if err != nil {
		for name := range backlogDescs {
			ch <- prometheus.NewInvalidMetric(b.desc(name), err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(b.desc("pending"), prometheus.GaugeValue, float64(s.Pending))
	ch <- prometheus.MustNewConstMetric(b.desc("oldest_pending_age_seconds"), prometheus.GaugeValue, s.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(b.desc("dead_lettered"), prometheus.GaugeValue, float64(s.DeadLettered))
	ch <- prometheus.MustNewConstMetric(b.desc("oldest_dead_lettered_age_seconds"), prometheus.GaugeValue, s.OldestDeadLettered.Seconds())
}

// scrapeTimeout bounds a scrape's read of the store.
const scrapeTimeout = 5 * time.Second
