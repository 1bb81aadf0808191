package forwarder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/tracing"
	"github.com/outboxkit/outboxkit/store"
)

// outcome is what the publishing phase of a pass did to its claimed rows.
type outcome struct {
	published   []publishedRow
	failed      []failedRow
	released    int   // claimed rows not attempted
	unreachable error // the first failure to reach the broker, which stopped the pass
}

type publishedRow struct {
	seq       int64
	createdAt time.Time
	attempts  int // failures before this success
}

type failedRow struct {
	seq       int64
	attempts  int // failures before this one
	err       error
	permanent bool // no attempt can succeed: dead-letter it now
}

// publishGroups publishes each group's rows in order, up to inFlight groups at a time. A group stops
// at its first failure (later rows of the key must not overtake it); every group stops starting new
// rows once the broker could not be reached or when ctx ends.
func (f *Forwarder) publishGroups(ctx context.Context, groups [][]store.OutboxRow, inFlight int) outcome {
	var (
		mu   sync.Mutex
		out  outcome
		wg   sync.WaitGroup
		sem  = make(chan struct{}, inFlight)
		stop = make(chan struct{})
		once sync.Once
	)
	halt := func() { once.Do(func() { close(stop) }) }
	stopped := func() bool {
		select {
		case <-stop:
			return true
		case <-ctx.Done():
			return true
		default:
			return false
		}
	}

	for gi, group := range groups {
		select {
		case sem <- struct{}{}:
		case <-stop:
		case <-ctx.Done():
		}
		if stopped() {
			mu.Lock()
			for _, g := range groups[gi:] {
				out.released += len(g)
			}
			mu.Unlock()
			// sem may hold a slot taken in the same select round; it is never read again.
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for i, r := range group {
				if stopped() || f.paused(r.Topic) {
					mu.Lock()
					out.released += len(group) - i
					mu.Unlock()
					return
				}
				err := f.publishRow(ctx, r)
				mu.Lock()
				switch {
				case err == nil:
					out.published = append(out.published, publishedRow{seq: r.Seq, createdAt: r.CreatedAt, attempts: r.Attempts})
					f.cfg.Metrics.Published(f.cfg.Now().Sub(r.CreatedAt), r.Attempts+1)
				case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
					// Shutting down: the row was not necessarily refused; leave it for the next relay.
					out.released += len(group) - i
				case f.cfg.IsUnreachable(err) || outboxkit.IsAccessDenied(err) || errors.Is(ctx.Err(), context.DeadlineExceeded):
					if out.unreachable == nil {
						out.unreachable = err
					}
					out.released += len(group) - i
					f.cfg.Metrics.PublishFailed(true)
					halt()
				default:
					out.failed = append(out.failed, failedRow{seq: r.Seq, attempts: r.Attempts, err: err, permanent: outboxkit.IsPermanent(err)})
					out.released += len(group) - i - 1
					f.cfg.Metrics.PublishFailed(false)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// publishRow sends one outbox row. A panic in the publisher is turned into a message failure so
// that one bad message cannot take the relay down.
func (f *Forwarder) publishRow(ctx context.Context, r store.OutboxRow) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("publisher panicked: %v", p)
		}
	}()
	msg, topic, err := f.toMessage(r)
	if err != nil {
		return err
	}
	// The publish is a trace of its own, linked to the writer's: a pass relays rows of many
	// requests, so no single one is its parent. The message keeps the writer's context, which the
	// consumers continue.
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithNewRoot(),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", topic),
			attribute.String("messaging.message.id", r.UUID),
			attribute.Int64("outboxkit.outbox.seq", r.Seq),
			attribute.Int("outboxkit.outbox.attempts", r.Attempts),
		),
	}
	if writer := tracing.Extract(msg.Metadata); writer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: writer}))
	}
	spanCtx, span := f.tracer.Start(ctx, "outbox publish "+topic, opts...)
	defer span.End()
	msg.SetContext(spanCtx)
	if err := f.cfg.Publisher.Publish(topic, msg); err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	return nil
}

func (f *Forwarder) toMessage(r store.OutboxRow) (*message.Message, string, error) {
	md := message.Metadata{}
	if err := json.Unmarshal(r.Metadata, &md); err != nil {
		return nil, "", outboxkit.Permanent(fmt.Errorf("outbox row %d: metadata is not a JSON object of strings: %w", r.Seq, err))
	}
	if r.PartitionKey != "" {
		md.Set(outboxkit.MetadataPartitionKey, r.PartitionKey) // stored in its column only
	}
	md.Set(outboxkit.MetadataCreatedAt, r.CreatedAt.UTC().Format(time.RFC3339Nano))
	md.Set(outboxkit.MetadataSeq, strconv.FormatInt(r.Seq, 10))
	msg := message.NewMessage(r.UUID, r.Payload)
	msg.Metadata = md
	topic := f.cfg.TopicMapping(r.Topic, r.PartitionKey)
	if topic == "" {
		return nil, "", outboxkit.Permanent(fmt.Errorf("outbox row %d: TopicMapping mapped topic %q to an empty topic", r.Seq, r.Topic))
	}
	return msg, topic, nil
}
