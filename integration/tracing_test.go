package integration

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
)

type capturingPublisher struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (c *capturingPublisher) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	return nil
}

func (c *capturingPublisher) Close() error { return nil }

// The trace of the request that wrote the outbox row travels with it: the relay's publish span
// links to it, and the consumer's span continues it.
func TestTracing_RequestToRelayToConsumer(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx := context.Background()

	// The request: a span around the business transaction that writes the event.
	reqCtx, reqSpan := tp.Tracer("test").Start(ctx, "POST /orders")
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(pg.Store, tx, pipeline.PublisherConfig{})
	msg := pipeline.NewEvent("OrderPlaced", "order-1", []byte(`{"id":"order-1"}`))
	msg.SetContext(reqCtx)
	if err := pub.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	reqSpan.End()
	if _, stored := msg.Metadata["traceparent"]; stored {
		t.Fatal("the caller's message was modified")
	}

	// The relay, in another process's life: a pass with no request context at all.
	broker := &capturingPublisher{}
	relay := newRelay(t, pgDB(pg), broker, func(c *forwarder.Config) { c.TracerProvider = tp })
	if res, err := relay.DispatchBatch(ctx); err != nil || res.Published != 1 {
		t.Fatalf("pass: %+v, %v", res, err)
	}

	// The consumer.
	stack, err := middleware.Stack(middleware.StackConfig{Store: pg.Store, Consumer: "billing", TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	var handlerSpan trace.SpanContext
	var h message.HandlerFunc = func(m *message.Message) ([]*message.Message, error) {
		handlerSpan = trace.SpanContextFromContext(m.Context())
		return nil, nil
	}
	for i := len(stack) - 1; i >= 0; i-- {
		h = stack[i](h)
	}
	delivered := message.NewMessage(broker.msgs[0].UUID, broker.msgs[0].Payload)
	delivered.Metadata = broker.msgs[0].Metadata
	if _, err := h(delivered); err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range recorder.Ended() {
		spans[s.Name()] = s
	}
	request, publish, process := spans["POST /orders"], spans["outbox publish orders"], spans["billing process"]
	if request == nil || publish == nil || process == nil {
		t.Fatalf("spans recorded: %v", spans)
	}
	reqSC := request.SpanContext()
	if len(publish.Links()) != 1 || publish.Links()[0].SpanContext.TraceID() != reqSC.TraceID() ||
		publish.Links()[0].SpanContext.SpanID() != reqSC.SpanID() {
		t.Fatalf("the publish span links to %v, want the request span %v", publish.Links(), reqSC)
	}
	if publish.SpanContext().TraceID() == reqSC.TraceID() || publish.SpanKind() != trace.SpanKindProducer {
		t.Fatal("the publish span must be a producer span in a trace of its own, linked to the request")
	}
	if process.SpanContext().TraceID() != reqSC.TraceID() || process.Parent().SpanID() != reqSC.SpanID() {
		t.Fatalf("the consumer span (trace %s, parent %s) does not continue the request (trace %s, span %s)",
			process.SpanContext().TraceID(), process.Parent().SpanID(), reqSC.TraceID(), reqSC.SpanID())
	}
	if handlerSpan.SpanID() != process.SpanContext().SpanID() {
		t.Fatal("the handler does not run inside the consumer span")
	}
}
