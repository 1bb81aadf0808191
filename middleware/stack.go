package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// StackConfig configures Stack. Zero values take each middleware's documented default.
type StackConfig struct {
	// Store holds the inbox tables and the consumer's own: store/pgxstore, pgsqlstore,
	// mysqlstore, sqlitestore, or store.Open. Required.
	Store store.Store
	// Consumer names the consuming service (Shipping, Billing…). Required; it must not change.
	Consumer string

	// MaxDeliveries before a message is dead-lettered (see DeadLetterConfig.MaxDeliveries: one that
	// crashes the process gets one more attempt, alone in the process). Default
	// DefaultMaxDeliveries (5).
	MaxDeliveries int
	// SoloWait bounds a suspect's wait to run alone: see DeadLetterConfig.SoloWait. Default
	// DefaultSoloWait (1 minute).
	SoloWait time.Duration
	// MaxSoloWaits bounds a suspect's deliveries in a row that wait SoloWait in vain before it is
	// dead-lettered: see DeadLetterConfig.MaxSoloWaits. Default DefaultMaxSoloWaits (3).
	MaxSoloWaits int
	// MaxRetries in-process before the error goes out. Default DefaultMaxRetries (3); -1 for none.
	MaxRetries int
	// RetryBackoff spaces the in-process retries. Default DefaultRetryBackoff.
	RetryBackoff outboxkit.Backoff
	// DedupWindow is how long the inbox recognises a message (see InboxConfig.DedupWindow).
	// Default DefaultDedupWindow (7 days).
	DedupWindow time.Duration
	// DisableFastPath skips the inbox's "seen already?" read. Default false.
	DisableFastPath bool
	// CountFirstDeliveries: see DeliveryCountConfig. Default false.
	CountFirstDeliveries bool
	// DeadLetterPublisher and DeadLetterTopic also send dead-lettered messages to a topic of their own.
	DeadLetterPublisher message.Publisher
	DeadLetterTopic     string
	// OrderGuard adds the per-key version guard (see NewOrderGuard), configured by its fields;
	// its Store, Consumer and Now are the stack's. Default nil: no guard.
	OrderGuard *OrderGuardConfig
	// CircuitBackoff spaces the probes while a dependency is unreachable. Default
	// DefaultCircuitBackoff.
	CircuitBackoff outboxkit.Backoff
	// IsUnreachable decides whether a failure means a dependency could not be reached (the
	// circuit holds the message; it never counts toward MaxDeliveries). Default
	// IsUnreachableIn(Store).
	IsUnreachable func(error) bool

	// Metrics receives each delivery's outcome and the circuit's state:
	// prom.NewConsumerMetrics(registerer) exports them to Prometheus. Default: no metrics middleware.
	Metrics Metrics
	// TracerProvider adds the tracing middleware, outermost. Default: no tracing middleware.
	TracerProvider trace.TracerProvider
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

// Stack builds the recommended middleware stack for one consumer, outermost first, ready for
// Handler.AddMiddleware (Watermill runs the first one added outermost):
//
//	[Tracing] → [Metrics] → Circuit → DeliveryCount → DeadLetter → Retry → Inbox → [OrderGuard] → handler
//
// AddConsumerHandler builds it and adds it with its handler and subscription in one call, refusing
// a subscription of another consumer than cfg.Consumer before anything runs; a stack added by hand
// to a handler whose subscriber reads for another consumer holds every message (ErrWrongConsumer).
func Stack(cfg StackConfig) ([]message.HandlerMiddleware, error) {
	var (
		stack []message.HandlerMiddleware
		errs  []error
	)
	add := func(m message.HandlerMiddleware, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		stack = append(stack, m)
	}
	if cfg.IsUnreachable == nil {
		cfg.IsUnreachable = IsUnreachableIn(cfg.Store)
	}
	if cfg.TracerProvider != nil {
		add(NewTracing(TracingConfig{Consumer: cfg.Consumer, TracerProvider: cfg.TracerProvider}))
	}
	if cfg.Metrics != nil {
		add(NewMetrics(MetricsConfig{Consumer: cfg.Consumer, Metrics: cfg.Metrics, Now: cfg.Now, Store: cfg.Store}))
	}
	add(NewCircuit(CircuitConfig{Consumer: cfg.Consumer, Backoff: cfg.CircuitBackoff, IsUnreachable: cfg.IsUnreachable,
		Metrics: cfg.Metrics, Now: cfg.Now, Logger: cfg.Logger}))
	add(NewDeliveryCount(DeliveryCountConfig{Store: cfg.Store, Consumer: cfg.Consumer,
		Now: cfg.Now, Logger: cfg.Logger, CountFirstDeliveries: cfg.CountFirstDeliveries, IsUnreachable: cfg.IsUnreachable}))
	add(NewDeadLetter(DeadLetterConfig{Store: cfg.Store, Consumer: cfg.Consumer,
		MaxDeliveries: cfg.MaxDeliveries, SoloWait: cfg.SoloWait, MaxSoloWaits: cfg.MaxSoloWaits, DeadLetterPublisher: cfg.DeadLetterPublisher, DeadLetterTopic: cfg.DeadLetterTopic,
		IsUnreachable: cfg.IsUnreachable, Now: cfg.Now, Logger: cfg.Logger}))
	add(NewRetry(RetryConfig{MaxRetries: cfg.MaxRetries, Backoff: cfg.RetryBackoff, IsUnreachable: cfg.IsUnreachable, Logger: cfg.Logger}))
	add(NewInbox(InboxConfig{Store: cfg.Store, Consumer: cfg.Consumer,
		DedupWindow: cfg.DedupWindow, DisableFastPath: cfg.DisableFastPath, Now: cfg.Now, Logger: cfg.Logger}))
	if cfg.OrderGuard != nil {
		og := *cfg.OrderGuard
		og.Store, og.Consumer, og.Now = cfg.Store, cfg.Consumer, cfg.Now
		add(NewOrderGuard(og))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("consumer %q: %w", cfg.Consumer, err)
	}
	return stack, nil
}
