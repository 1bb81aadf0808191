// Package tracing carries W3C trace context in Watermill message metadata.
//
// It uses the W3C TraceContext format directly rather than the global propagator, so that trace
// context travels through the outbox even in a process that never configured one.
package tracing

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

var format = propagation.TraceContext{}

// carrier adapts message metadata to a TextMapCarrier.
type carrier message.Metadata

func (c carrier) Get(key string) string { return message.Metadata(c).Get(key) }
func (c carrier) Set(key, value string) { message.Metadata(c).Set(key, value) }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Has reports whether md already carries a trace context.
func Has(md message.Metadata) bool { return md.Get("traceparent") != "" }

// Inject writes the span context of ctx into md. It writes nothing when ctx has no valid span.
func Inject(ctx context.Context, md message.Metadata) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		format.Inject(ctx, carrier(md))
	}
}

// Extract returns the span context md carries (invalid when it carries none).
func Extract(md message.Metadata) trace.SpanContext {
	return trace.SpanContextFromContext(format.Extract(context.Background(), carrier(md)))
}

// ContextWithRemote returns ctx with md's span context as the remote parent.
func ContextWithRemote(ctx context.Context, md message.Metadata) context.Context {
	return format.Extract(ctx, carrier(md))
}
