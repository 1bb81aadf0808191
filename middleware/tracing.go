package middleware

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit/internal/tracing"
)

// TracingConfig configures NewTracing.
type TracingConfig struct {
	// Consumer names the span ("<consumer> process") and labels it. Required.
	Consumer string
	// TracerProvider makes the spans. Required: otel.GetTracerProvider() is the application's
	// global one.
	TracerProvider trace.TracerProvider
}

// NewTracing starts a span per delivery that continues the trace carried in the message's
// metadata — the trace of the transaction that wrote the outbox row — and hands it to the handler
// through the message context. It belongs outermost, so the span covers the whole delivery.
func NewTracing(cfg TracingConfig) (message.HandlerMiddleware, error) {
	if !consumerName.MatchString(cfg.Consumer) {
		return nil, errors.New("tracing config: field Consumer is required: name the consuming service")
	}
	if cfg.TracerProvider == nil {
		return nil, errors.New("tracing config: field TracerProvider is required (otel.GetTracerProvider() for the global one)")
	}
	tracer := cfg.TracerProvider.Tracer("github.com/outboxkit/outboxkit/middleware")
	name := cfg.Consumer + " process"
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			parent := msg.Context()
			ctx, span := tracer.Start(tracing.ContextWithRemote(parent, msg.Metadata), name,
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					attribute.String("messaging.operation.type", "process"),
					attribute.String("messaging.consumer.group.name", cfg.Consumer),
					attribute.String("messaging.destination.name", subscribeTopic(parent)),
					attribute.String("messaging.message.id", msg.UUID),
				))
			defer span.End()
			msg.SetContext(ctx)
			out, err := h(msg)
			d := deliveryOf(msg)
			span.SetAttributes(attribute.Int("outboxkit.deliveries", d.count), attribute.Bool("outboxkit.duplicate", d.duplicate),
				attribute.Bool("outboxkit.dead_lettered", d.deadLettered))
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return out, err
		}
	}, nil
}
