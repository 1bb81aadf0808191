package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/promreg"
	"github.com/outboxkit/outboxkit/store"
)

// MetricsConfig configures NewMetrics.
type MetricsConfig struct {
	// Consumer labels the series. Required.
	Consumer string
	// Registerer receives the metrics. Default prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Store, when set, is read at every scrape for the consumer's dead letters that wait for a
	// replay: outboxkit_consumer_dead_letters_waiting and
	// outboxkit_consumer_oldest_dead_letter_age_seconds. Stack sets it to its own.
	Store store.Store
}

// NewMetrics counts each delivery's outcome per consumer — processed, duplicate, dead-lettered,
// failed (to be redelivered) — and observes handler duration and commit-to-effect latency (from
// the outbox row's insert to the handler's success). It belongs outermost, to see every outcome.
//
// Series: outboxkit_consumer_messages_total{consumer,outcome}, outboxkit_consumer_handler_seconds,
// outboxkit_consumer_commit_to_effect_seconds.
func NewMetrics(cfg MetricsConfig) (message.HandlerMiddleware, error) {
	m, err := newConsumerMetrics(cfg)
	if err != nil {
		return nil, err
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d := deliveryOf(msg)
			start := m.now()
			out, err := h(msg)
			m.record(msg, d, err, m.now().Sub(start))
			return out, err
		}
	}, nil
}

// consumerMetrics are one consumer's series, shared by the Metrics middleware and the batch
// consumer.
type consumerMetrics struct {
	now                                        func() time.Time
	processed, duplicate, dead, failed, parked prometheus.Counter
	duration, latency                          prometheus.Observer
}

func newConsumerMetrics(cfg MetricsConfig) (*consumerMetrics, error) {
	if !consumerName.MatchString(cfg.Consumer) {
		return nil, errors.New("metrics config: field Consumer is required: name the consuming service")
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.DefaultRegisterer
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	var err error
	if cfg.Store != nil {
		// One collector per consumer, told apart by a constant label, so that several consumers'
		// stacks can share a registry.
		waiting := &deadLetterCollector{s: cfg.Store, consumer: cfg.Consumer, now: cfg.Now,
			count: prometheus.NewDesc("outboxkit_consumer_dead_letters_waiting",
				"Quarantined messages of the consumer not yet replayed, read from the store at scrape time.",
				nil, prometheus.Labels{"consumer": cfg.Consumer}),
			age: prometheus.NewDesc("outboxkit_consumer_oldest_dead_letter_age_seconds",
				"How long the consumer's oldest quarantined message not yet replayed has waited (0 when none).",
				nil, prometheus.Labels{"consumer": cfg.Consumer}),
		}
		promreg.Register(cfg.Registerer, &waiting, &err)
	}
	promreg.Register(cfg.Registerer, &outcomes, &err)
	promreg.Register(cfg.Registerer, &duration, &err)
	promreg.Register(cfg.Registerer, &latency, &err)
	if err != nil {
		return nil, err
	}
	outcome := func(o string) prometheus.Counter { return outcomes.WithLabelValues(cfg.Consumer, o) }
	return &consumerMetrics{
		now:       cfg.Now,
		processed: outcome("processed"), duplicate: outcome("duplicate"), dead: outcome("dead_lettered"), failed: outcome("failed"),
		parked:   outcome("parked"),
		duration: duration.WithLabelValues(cfg.Consumer), latency: latency.WithLabelValues(cfg.Consumer),
	}, nil
}

// record counts one delivery's outcome, after its effect committed (or did not).
func (m *consumerMetrics) record(msg *message.Message, d *delivery, err error, took time.Duration) {
	m.duration.Observe(took.Seconds())
	switch {
	case d.deadLettered:
		m.dead.Inc()
	case d.duplicate:
		m.duplicate.Inc()
	case d.parked && err == nil:
		m.parked.Inc()
	case err != nil:
		m.failed.Inc()
	default:
		m.processed.Inc()
		if created, ok := outboxkit.CreatedAt(msg); ok {
			m.latency.Observe(m.now().Sub(created).Seconds())
		}
	}
}

// deadLetterCollector reads the consumer's waiting dead letters at scrape time: a counter of
// quarantines would forget, within its rate window, letters that still wait.
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

// scrapeTimeout bounds a scrape's read of the store.
const scrapeTimeout = 5 * time.Second
