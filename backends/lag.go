package backends

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lag is what the broker holds for one consumer group of one topic, read when asked: the slow
// consumer's side of the pipeline, which the outbox's backlog cannot show.
type Lag struct {
	// Waiting is how many of the topic's messages the group has not been handed yet: RabbitMQ's
	// ready messages in the group's queue, JetStream's pending count for the group's consumer,
	// Redis Streams' group lag. On Kafka, where the committed offset is the acknowledgement, it
	// is everything after the group's committed offsets, handed out or not.
	Waiting int64
	// Unacked is how many the group's consumers hold without having acknowledged them (being
	// handled, or stranded with a consumer that died). HasUnacked is false where the broker
	// cannot say (RabbitMQ over AMQP 0-9-1; Kafka, where Waiting includes them).
	Unacked    int64
	HasUnacked bool
	// OldestAge is how long the oldest message the group has not acknowledged has been in the
	// broker; HasAge is false where the broker cannot say (RabbitMQ) or nothing waits.
	OldestAge time.Duration
	HasAge    bool
}

// ErrLagUnknown is returned by Lag for a backend that cannot report a consumer group's backlog:
// memory:// (Watermill's in-process channel holds nothing to count).
var ErrLagUnknown = errors.New("this backend cannot report a consumer group's backlog")

// ReportsLag reports whether Lag can read this backend's consumer groups (not memory://).
func (b *Backend) ReportsLag() bool { return b.lag != nil }

// Lag reads how far consumer group group is behind on topic, from the broker, now. It opens what
// it needs on first use and keeps it until Close; it is safe for concurrent use.
func (b *Backend) Lag(ctx context.Context, topic, group string) (Lag, error) {
	if b.lag == nil {
		return Lag{}, fmt.Errorf("%s://: %w", b.Scheme, ErrLagUnknown)
	}
	l, err := b.lag(ctx, topic, group)
	if err != nil {
		return Lag{}, fmt.Errorf("backlog of group %s on %s: %w", group, topic, err)
	}
	return l, nil
}
