package natsbackend

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// natsLag reads the group's durable consumer: pending (not yet delivered) and ack-pending counts,
// and the time of the first message after its ack floor.
type natsLag struct {
	connect func(name string) (*nats.Conn, error)
	mu      sync.Mutex
	conn    *nats.Conn
	js      jetstream.JetStream
}

func (n *natsLag) read(ctx context.Context, topic, group string) (backends.Lag, error) {
	n.mu.Lock()
	if n.conn == nil {
		conn, err := n.connect("outboxkit-lag")
		if err != nil {
			n.mu.Unlock()
			return backends.Lag{}, err
		}
		js, err := jetstream.New(conn)
		if err != nil {
			conn.Close()
			n.mu.Unlock()
			return backends.Lag{}, err
		}
		n.conn, n.js = conn, js
	}
	js := n.js
	n.mu.Unlock()
	stream, err := js.Stream(ctx, natsStream(topic))
	if err != nil {
		return backends.Lag{}, classifyNATS(err)
	}
	consumer, err := stream.Consumer(ctx, natsStream("outboxkit_"+group))
	if err != nil {
		return backends.Lag{}, fmt.Errorf("consumer of group %s (has the group subscribed yet?): %w", group, classifyNATS(err))
	}
	info, err := consumer.Info(ctx)
	if err != nil {
		return backends.Lag{}, classifyNATS(err)
	}
	l := backends.Lag{Waiting: int64(info.NumPending), Unacked: int64(info.NumAckPending), HasUnacked: true}
	if l.Waiting+l.Unacked > 0 {
		if msg, err := stream.GetMsg(ctx, info.AckFloor.Stream+1); err == nil {
			l.OldestAge, l.HasAge = brokerio.AgeOf(msg.Time), true
		}
	}
	return l, nil
}

func (n *natsLag) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn != nil {
		n.conn.Close()
	}
	return nil
}
