package tracing

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The hand-written format must agree with OpenTelemetry's own propagator, both ways.
func TestAgreesWithTheW3CPropagator(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=a,other=b")
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: [16]byte{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
			SpanID:  [8]byte{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31}, TraceFlags: flags, TraceState: ts,
		})
		ctx := trace.ContextWithSpanContext(context.Background(), sc)
		ours := message.Metadata{}
		Inject(ctx, ours)
		theirs := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(ctx, theirs)
		if ours.Get("traceparent") != theirs.Get("traceparent") || ours.Get("tracestate") != theirs.Get("tracestate") {
			t.Fatalf("flags %v: wrote %v, the W3C propagator writes %v", flags, ours, theirs)
		}
		back := Extract(ours)
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), theirs))
		if !back.Equal(want) || !back.IsRemote() {
			t.Fatalf("flags %v: read %+v, the W3C propagator reads %+v", flags, back, want)
		}
	}
}

func TestMalformedTraceparentsAreIgnored(t *testing.T) {
	for _, tp := range []string{
		"", "garbage",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", // version 00 has no more fields
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",       // version ff is invalid
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",       // zero trace id
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",       // zero span id
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz",       // bad flags
		"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",       // bad separator
	} {
		md := message.Metadata{"traceparent": tp}
		if sc := Extract(md); sc.IsValid() {
			t.Errorf("%q read as %+v", tp, sc)
		}
		want := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
		if trace.SpanContextFromContext(want).IsValid() {
			t.Errorf("%q: the W3C propagator accepts it, this package does not", tp)
		}
	}
	// A later version may carry more fields: its first four are read.
	if sc := Extract(message.Metadata{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more"}); !sc.IsValid() {
		t.Error("a version-01 traceparent with an extra field was refused")
	}
}
