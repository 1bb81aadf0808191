package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/internal/promreg"

	"github.com/outboxkit/outboxkit"
)

// MetricsConfig configures NewMetrics.
type MetricsConfig struct {
	// Consumer labels the series. Required.
	Consumer string
	// Registerer receives the metrics. Default prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// NewMetrics counts each delivery's outcome per consumer — processed, duplicate, dead-lettered,
// failed (to be redelivered) — and observes handler duration and commit-to-effect latency (from
// the outbox row's insert to the handler's success). It belongs outermost, to see every outcome.
//
// Series: outboxkit_consumer_messages_total{consumer,outcome}, outboxkit_consumer_handler_seconds,
// outboxkit_consumer_commit_to_effect_seconds.
func NewMetrics(cfg MetricsConfig) (message.HandlerMiddleware, error) {
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
		Help: "Deliveries by outcome: processed, duplicate, dead_lettered, failed (redelivered later).",
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
	promreg.Register(cfg.Registerer, &outcomes, &err)
	promreg.Register(cfg.Registerer, &duration, &err)
	promreg.Register(cfg.Registerer, &latency, &err)
	if err != nil {
		return nil, err
	}
	outcome := func(o string) prometheus.Counter { return outcomes.WithLabelValues(cfg.Consumer, o) }
	processed, duplicate, dead, failed := outcome("processed"), outcome("duplicate"), outcome("dead_lettered"), outcome("failed")
	durationObs, latencyObs := duration.WithLabelValues(cfg.Consumer), latency.WithLabelValues(cfg.Consumer)

	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d := deliveryOf(msg)
			start := cfg.Now()
			out, err := h(msg)
			end := cfg.Now()
			durationObs.Observe(end.Sub(start).Seconds())
			switch {
			case d.deadLettered:
				dead.Inc()
			case d.duplicate:
				duplicate.Inc()
			case err != nil:
				failed.Inc()
			default:
				processed.Inc()
				if created, ok := outboxkit.CreatedAt(msg); ok {
					latencyObs.Observe(end.Sub(created).Seconds())
				}
			}
			return out, err
		}
	}, nil
}
