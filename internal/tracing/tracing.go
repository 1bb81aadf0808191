// Package tracing carries W3C trace context (traceparent, tracestate) in Watermill message
// metadata.
//
// It reads and writes the W3C format itself rather than through OpenTelemetry's propagation
// package, which imports net/http: every service would compile an HTTP stack to carry two strings.
// It also works in a process that never configured a global propagator.
package tracing

import (
	"context"
	"encoding/hex"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"
)

const (
	traceparentKey = "traceparent"
	tracestateKey  = "tracestate"
)

// Has reports whether md already carries a trace context.
func Has(md message.Metadata) bool { return md.Get(traceparentKey) != "" }

// Inject writes the span context of ctx into md. It writes nothing when ctx has no valid span.
func Inject(ctx context.Context, md message.Metadata) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	flags := hex.EncodeToString([]byte{byte(sc.TraceFlags() & trace.FlagsSampled)})
	md.Set(traceparentKey, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+flags)
	if ts := sc.TraceState().String(); ts != "" {
		md.Set(tracestateKey, ts)
	}
}

// Extract returns the span context md carries (invalid when it carries none, or a malformed one).
func Extract(md message.Metadata) trace.SpanContext {
	tp := strings.TrimSpace(md.Get(traceparentKey))
	// version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 characters for version
	// 00; a later version may append fields after a dash.
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || (len(tp) > 55 && tp[55] != '-') {
		return trace.SpanContext{}
	}
	version, err := hex.DecodeString(tp[0:2])
	if err != nil || version[0] == 0xff || (version[0] == 0 && len(tp) != 55) {
		return trace.SpanContext{}
	}
	traceID, err := trace.TraceIDFromHex(tp[3:35])
	if err != nil {
		return trace.SpanContext{}
	}
	spanID, err := trace.SpanIDFromHex(tp[36:52])
	if err != nil {
		return trace.SpanContext{}
	}
	flags, err := hex.DecodeString(tp[53:55])
	if err != nil {
		return trace.SpanContext{}
	}
	cfg := trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true}
	if ts, err := trace.ParseTraceState(md.Get(tracestateKey)); err == nil {
		cfg.TraceState = ts
	}
	sc := trace.NewSpanContext(cfg)
	if !sc.IsValid() {
		return trace.SpanContext{}
	}
	return sc
}

// ContextWithRemote returns ctx with md's span context as the remote parent (ctx unchanged when md
// carries none).
func ContextWithRemote(ctx context.Context, md message.Metadata) context.Context {
	sc := Extract(md)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
