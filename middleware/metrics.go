package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// Outcome is what became of one delivery.
type Outcome string

const (
	// Processed: the handler's effect committed with the message's inbox row.
	Processed Outcome = "processed"
	// Duplicate: the inbox had the message already; acknowledged without running the handler.
	Duplicate Outcome = "duplicate"
	// DeadLettered: set aside in the consumer's dead letters and acknowledged.
	DeadLettered Outcome = "dead_lettered"
	// Failed: not settled; the broker delivers it again later.
	Failed Outcome = "failed"
	// Parked: ahead of its key's turn, kept to be applied with its predecessor (OrderGuard).
	Parked Outcome = "parked"
)

// CircuitState is the state of a consumer's circuit; its value is what the
// outboxkit_consumer_circuit_state gauge exports.
type CircuitState int

const (
	CircuitClosed  CircuitState = 0 // handling messages
	CircuitOpen    CircuitState = 1 // a dependency is unreachable: every message waits
	CircuitProbing CircuitState = 2 // one message tries again
)

// Metrics receives what one consumer's deliveries become, for a metrics system:
// prom.NewConsumerMetrics exports it to Prometheus. The middleware imports no metrics library; a
// program pays for one only if it passes one.
//
// Stack and NewBatchConsumer call Attach; the other methods are called from the handlers'
// goroutines, concurrently, and must be cheap and safe for concurrent use. A Metrics value serves
// one consumer.
type Metrics interface {
	// Attach binds the metrics to a consumer, whose dead letters s holds, on the stack's clock;
	// it is called again, with the same arguments, by every part of one consumer's stack. An error
	// fails the stack.
	Attach(consumer string, s store.Store, now func() time.Time) error
	// Delivered is called once per delivery, after its outcome is settled: took is the time spent
	// in the stack and handler; sinceCommit, for a processed message, the time since its outbox row
	// was written (negative when the message does not say).
	Delivered(outcome Outcome, took, sinceCommit time.Duration)
	// CircuitChanged is called when the consumer's circuit changes state.
	CircuitChanged(state CircuitState)
}

// MetricsConfig configures NewMetrics.
type MetricsConfig struct {
	// Consumer names the consuming service. Required.
	Consumer string
	// Metrics receives the outcomes. Required.
	Metrics Metrics
	// Store holds the consumer's dead letters, for Metrics.Attach. Stack sets it to its own.
	Store store.Store
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// NewMetrics reports each delivery's outcome — processed, duplicate, dead-lettered, failed (to be
// redelivered), parked — with the time spent handling it and, once processed, the time since its
// outbox row was written, to cfg.Metrics. It belongs outermost, to see every outcome.
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

// consumerMetrics turns one consumer's deliveries into Metrics calls, for the Metrics middleware
// and the batch consumer alike.
type consumerMetrics struct {
	now func() time.Time
	m   Metrics
}

func newConsumerMetrics(cfg MetricsConfig) (*consumerMetrics, error) {
	if !consumerName.MatchString(cfg.Consumer) {
		return nil, errors.New("metrics config: field Consumer is required: name the consuming service")
	}
	if cfg.Metrics == nil {
		return nil, errors.New("metrics config: field Metrics is required (prom.NewConsumerMetrics, say)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := cfg.Metrics.Attach(cfg.Consumer, cfg.Store, cfg.Now); err != nil {
		return nil, err
	}
	return &consumerMetrics{now: cfg.Now, m: cfg.Metrics}, nil
}

// record reports one delivery's outcome, after its effect committed (or did not).
func (m *consumerMetrics) record(msg *message.Message, d *delivery, err error, took time.Duration) {
	switch {
	case d.deadLettered:
		m.m.Delivered(DeadLettered, took, -1)
	case d.duplicate:
		m.m.Delivered(Duplicate, took, -1)
	case d.parked && err == nil:
		m.m.Delivered(Parked, took, -1)
	case err != nil:
		m.m.Delivered(Failed, took, -1)
	default:
		since := time.Duration(-1)
		if created, ok := outboxkit.CreatedAt(msg); ok {
			since = max(0, m.now().Sub(created))
		}
		m.m.Delivered(Processed, took, since)
	}
}
