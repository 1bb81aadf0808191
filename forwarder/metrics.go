package forwarder

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/internal/promreg"
)

type metrics struct {
	now          func() time.Time
	published    prometheus.Counter
	failures     *prometheus.CounterVec
	deadLettered prometheus.Counter
	latency      prometheus.Histogram
	attempts     prometheus.Histogram
	circuit      prometheus.Gauge
	lastPass     prometheus.Gauge
	lastPublish  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, name, schemaName string, f *Forwarder) (*metrics, error) {
	labels := prometheus.Labels{"forwarder": name, "schema": schemaName}
	m := &metrics{now: f.cfg.Now}
	opts := func(n, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "outboxkit", Subsystem: "forwarder", Name: n, Help: help, ConstLabels: labels}
	}
	*m = metrics{
		now: f.cfg.Now,
		published: prometheus.NewCounter(prometheus.CounterOpts(opts("published_total",
			"Outbox rows published and confirmed by the broker."))),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts(opts("publish_failures_total",
			"Failed publishes, by kind: message (attempt counted) or transport (broker unreachable).")), []string{"kind"}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts(opts("dead_lettered_total",
			"Outbox rows dead-lettered after MaxAttempts."))),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "outboxkit", Subsystem: "forwarder", Name: "commit_to_confirm_seconds", ConstLabels: labels,
			Help:    "Time from the outbox row's insert to the broker's confirm.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "outboxkit", Subsystem: "forwarder", Name: "publish_attempts", ConstLabels: labels,
			Help:    "Attempts a row needed to be published (1 = first try).",
			Buckets: []float64{1, 2, 3, 5, 10, 20},
		}),
		circuit: prometheus.NewGauge(prometheus.GaugeOpts(opts("circuit_state",
			"Broker circuit: 0 closed, 1 open (broker unreachable), 2 half-open (probing)."))),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_pass_timestamp_seconds",
			"Unix time of the last completed pass, whether or not it found rows."))),
		lastPublish: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_publish_timestamp_seconds",
			"Unix time of the last pass that published at least one row."))),
	}
	if reg == nil {
		return m, nil
	}
	// Forwarders with the same name and schema in one process share their series.
	var err error
	promreg.Register(reg, &m.published, &err)
	promreg.Register(reg, &m.failures, &err)
	promreg.Register(reg, &m.deadLettered, &err)
	promreg.Register(reg, &m.latency, &err)
	promreg.Register(reg, &m.attempts, &err)
	promreg.Register(reg, &m.circuit, &err)
	promreg.Register(reg, &m.lastPass, &err)
	promreg.Register(reg, &m.lastPublish, &err)
	var backlog prometheus.Collector = &backlogCollector{f: f, labels: prometheus.Labels{"schema": schemaName}}
	promreg.Register(reg, &backlog, &err)
	return m, err
}

func (m *metrics) observePublished(latency time.Duration, attempts int) {
	m.latency.Observe(latency.Seconds())
	m.attempts.Observe(float64(attempts))
}

func (m *metrics) pass(published bool) {
	now := float64(m.now().UnixNano()) / 1e9
	m.lastPass.Set(now)
	if published {
		m.lastPublish.Set(now)
	}
}

// backlogCollector exports Stats at scrape time.
type backlogCollector struct {
	f      *Forwarder
	labels prometheus.Labels
}

var backlogDescs = func() map[string]string {
	return map[string]string{
		"pending":                          "Outbox rows waiting to be published.",
		"oldest_pending_age_seconds":       "Age of the oldest outbox row waiting to be published.",
		"dead_lettered":                    "Outbox rows dead-lettered, waiting for an operator's replay.",
		"oldest_dead_lettered_age_seconds": "Time since the oldest outbox dead letter was parked.",
	}
}()

func (b *backlogCollector) desc(name string) *prometheus.Desc {
	return prometheus.NewDesc("outboxkit_outbox_"+name, backlogDescs[name], nil, b.labels)
}

func (b *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for name := range backlogDescs {
		ch <- b.desc(name)
	}
}

func (b *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
