package prom

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// ConsumerMetrics exports one consumer's metrics; pass it as middleware.StackConfig.Metrics (or
// BatchConfig's). Every series carries the consumer label:
//
//	outboxkit_consumer_messages_total{consumer,outcome}          deliveries by outcome: processed, duplicate, dead_lettered, failed, parked
//	outboxkit_consumer_handler_seconds{consumer}                 time in the stack and handler per delivery
//	outboxkit_consumer_commit_to_effect_seconds{consumer}        from the outbox row's insert to the committed effect
//	outboxkit_consumer_circuit_state{consumer}                   0 closed, 1 open, 2 probing
//	outboxkit_consumer_dead_letters_waiting{consumer}            dead letters not yet replayed, read from the store at scrape time
//	outboxkit_consumer_oldest_dead_letter_age_seconds{consumer}  how long the oldest of them has waited
type ConsumerMetrics struct {
	reg prometheus.Registerer

	mu       sync.Mutex
	consumer string // "" until attached

	outcomes          map[middleware.Outcome]prometheus.Counter
	duration, latency prometheus.Observer
	circuit           prometheus.Gauge
}

var _ middleware.Metrics = (*ConsumerMetrics)(nil)

// NewConsumerMetrics returns the metrics of one consumer, registered in reg when its stack is
// built (middleware.Stack fails if they cannot be). A nil reg means prometheus.DefaultRegisterer.
func NewConsumerMetrics(reg prometheus.Registerer) *ConsumerMetrics {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	return &ConsumerMetrics{reg: reg}
}

// Attach registers the consumer's series; s, when not nil, is read at each scrape for the
// consumer's dead letters waiting for a replay, their age measured on now (nil: time.Now). A
// second call for the same consumer does nothing.
func (m *ConsumerMetrics) Attach(consumer string, s store.Store, now func() time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.consumer != "" {
		if m.consumer != consumer {
			return fmt.Errorf("prom: these ConsumerMetrics serve consumer %q, not %q: make one per consumer", m.consumer, consumer)
		}
		return nil
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "outboxkit", Subsystem: "consumer", Name: "messages_total",
		Help: "Deliveries by outcome: processed, duplicate, dead_lettered, failed (redelivered later), parked (ahead of its key's turn, applied with its predecessor).",
	}, []string{"consumer", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "outboxkit", Subsystem: "consumer", Name: "handler_seconds",
		Help:    "Time spent in the middleware stack and handler per delivery.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"consumer"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "outboxkit", Subsystem: "consumer", Name: "commit_to_effect_seconds",
		Help:    "Time from the outbox row's insert to the consumer's committed effect.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"consumer"})
	circuit := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "outboxkit", Subsystem: "consumer", Name: "circuit_state",
		Help: "Consumer circuit: 0 closed, 1 open (a dependency is unreachable), 2 probing.",
	}, []string{"consumer"})
	if now == nil {
		now = time.Now
	}
	var err error
	if s != nil {
		// One collector per consumer, told apart by a constant label, so that several consumers'
		// stacks can share a registry.
		var waiting prometheus.Collector = &deadLetterCollector{s: s, consumer: consumer, now: now,
			count: prometheus.NewDesc("outboxkit_consumer_dead_letters_waiting",
				"Dead letters of the consumer not yet replayed, read from the store at scrape time.",
				nil, prometheus.Labels{"consumer": consumer}),
			age: prometheus.NewDesc("outboxkit_consumer_oldest_dead_letter_age_seconds",
				"How long the consumer's oldest dead letter not yet replayed has waited (0 when none).",
				nil, prometheus.Labels{"consumer": consumer}),
		}
		register(m.reg, &waiting, &err)
	}
	register(m.reg, &outcomes, &err)
	register(m.reg, &duration, &err)
	register(m.reg, &latency, &err)
	register(m.reg, &circuit, &err)
	if err != nil {
		return err
	}
	m.outcomes = map[middleware.Outcome]prometheus.Counter{}
	for _, o := range []middleware.Outcome{middleware.Processed, middleware.Duplicate, middleware.DeadLettered, middleware.Failed, middleware.Parked} {
		m.outcomes[o] = outcomes.WithLabelValues(consumer, string(o))
	}
	m.duration, m.latency = duration.WithLabelValues(consumer), latency.WithLabelValues(consumer)
	m.circuit = circuit.WithLabelValues(consumer)
	m.consumer = consumer
	return nil
}

func (m *ConsumerMetrics) Delivered(outcome middleware.Outcome, took, sinceCommit time.Duration) {
	m.duration.Observe(took.Seconds())
	if c := m.outcomes[outcome]; c != nil {
		c.Inc()
	}
	if outcome == middleware.Processed && sinceCommit >= 0 {
		m.latency.Observe(sinceCommit.Seconds())
	}
}

func (m *ConsumerMetrics) CircuitChanged(state middleware.CircuitState) {
	m.circuit.Set(float64(state))
}

// deadLetterCollector reads the consumer's waiting dead letters at scrape time: a counter of dead
// letters would forget, within its rate window, letters that still wait.
type deadLetterCollector struct {
	s          store.Store
	consumer   string
	now        func() time.Time
	count, age *prometheus.Desc
}

func (c *deadLetterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.count; ch <- c.age }

func (c *deadLetterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	w, err := c.s.DeadLettersWaiting(ctx, c.consumer, c.now())
	if err != nil {
		// No figure rather than a wrong one: the scrape reports the error (as the forwarder's
		// backlog does when the database is down).
		ch <- prometheus.NewInvalidMetric(c.count, err)
		ch <- prometheus.NewInvalidMetric(c.age, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(w.Count))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, w.OldestAge.Seconds())
}
