package amqpbackend

import (
	"context"
	"fmt"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/backends"
)

// amqpLag reads the group's queue with a passive declare. AMQP 0-9-1 tells the ready messages and
// nothing else: the unacknowledged count and the messages' ages are in the management plugin's
// HTTP API, not in the protocol.
type amqpLag struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

func (a *amqpLag) read(ctx context.Context, topic, group string) (backends.Lag, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil || a.conn.IsClosed() {
		conn, err := amqp.DialConfig(a.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second), Properties: amqp.Table{"connection_name": "outboxkit-lag"}})
		if err != nil {
			return backends.Lag{}, err
		}
		a.conn = conn
	}
	ch, err := a.conn.Channel()
	if err != nil {
		return backends.Lag{}, err
	}
	defer ch.Close()
	queue := wamqp.GenerateQueueNameTopicNameWithSuffix(group)(topic)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return backends.Lag{}, fmt.Errorf("queue %s (has the group subscribed yet?): %w", queue, err)
	}
	return backends.Lag{Waiting: int64(q.Messages)}, nil
}

func (a *amqpLag) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		return a.conn.Close()
	}
	return nil
}
