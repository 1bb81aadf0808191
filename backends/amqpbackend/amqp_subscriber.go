package amqpbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// SubscriberConfig configures a consumer on RabbitMQ.
type SubscriberConfig struct {
	// URL is the broker. Required.
	URL string
	// Consumer names the consuming service (Shipping, Billing…), as the middleware stack's
	// StackConfig.Consumer does. Each consumer has its own durable queue, named
	// "<topic>_<consumer>", bound to the topic's exchange, so every consumer gets every message.
	// Required.
	Consumer string
	// Prefetch is how many unacknowledged messages the broker hands over at once. Default 16.
	Prefetch int
	// Unacked is how many messages a subscription hands out before the first is acknowledged.
	// Default 1: one at a time, as Watermill's subscribers do, which the router needs for per-key
	// order. A batching consumer (middleware.BatchConsumer) sets it to its batch size, so that a
	// batch can fill; acknowledgements may then come in any order. Prefetch is raised to at least
	// Unacked.
	Unacked int
	// QuorumQueues declares the group's queue as a quorum queue. Default false (classic durable).
	QuorumQueues bool
	// Reconnect paces the attempts to reach the broker again after a lost connection.
	// Default 200ms doubling to 5s.
	Reconnect outboxkit.Backoff
	// DialTimeout bounds a connection attempt. Default 5s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval, which detects a dead connection. Default 10s.
	Heartbeat time.Duration
	// Logger receives connection events. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

// NewSubscriber builds a subscriber for one consumer group: the topology of watermill-amqp's
// NewDurablePubSubConfig (a durable fanout exchange per topic, a durable queue per topic and group),
// manual acknowledgements, and watermill-amqp's message format, so it reads what Publisher and
// watermill-amqp's publisher write. A nacked message is requeued and delivered again; so is one in
// flight when its subscription ends. Headers RabbitMQ adds that are not strings (x-delivery-count on
// quorum queues, x-death after dead-lettering) are turned into strings instead of failing the whole
// delivery. After a lost connection every subscription resumes by itself.
//
// It replaces watermill-amqp's subscriber, whose connection wrapper reassigns its state while
// reconnecting without synchronisation (a data race on every broker blip, reported upstream as
// ThreeDotsLabs/watermill#693) and whose Close dereferences a nil logger.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqp subscriber: URL is required, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("amqp subscriber: URL %q: %w (want amqp://user:pass@host:5672/vhost)", brokerio.Redact(cfg.URL), err)
	}
	if cfg.Consumer == "" {
		return nil, errors.New("amqp subscriber: Consumer is required: name the consuming service (e.g. \"shipping\")")
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = 16
	}
	if cfg.Unacked == 0 {
		cfg.Unacked = 1
	}
	cfg.Prefetch = max(cfg.Prefetch, cfg.Unacked)
	if cfg.Reconnect == (outboxkit.Backoff{}) {
		cfg.Reconnect = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Default()
	}
	if cfg.Prefetch < 0 || cfg.Unacked < 0 || cfg.DialTimeout < 0 || cfg.Heartbeat < 0 {
		return nil, errors.New("amqp subscriber: Prefetch, Unacked, DialTimeout and Heartbeat must not be negative")
	}
	if err := cfg.Reconnect.Validate("Reconnect"); err != nil {
		return nil, fmt.Errorf("amqp subscriber: %w", err)
	}
	return &Subscriber{
		cfg:       cfg,
		marshaler: wamqp.DefaultMarshaler{PreprocessDelivery: stringifyHeaders},
	}, nil
}

// Subscriber is a consumer group's subscriber on RabbitMQ; see NewSubscriber.
type Subscriber struct {
	cfg       SubscriberConfig
	marshaler wamqp.DefaultMarshaler

	life brokerio.Lifetime
	mu   sync.Mutex // guards conn
	conn *amqp.Connection
}

// connection returns the live connection, dialing when there is none.
func (s *Subscriber) connection() (*amqp.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.Closed() { // Close closes the connection under mu after this: none is dialed after it
		return nil, errors.New("amqp subscriber is closed")
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{
		Heartbeat:  s.cfg.Heartbeat,
		Properties: amqp.Table{"connection_name": "outboxkit-" + s.cfg.Consumer},
		Dial:       amqp.DefaultDial(s.cfg.DialTimeout),
	})
	if err != nil {
		return nil, markAccessDenied(fmt.Errorf("connect to %s: %w", brokerio.Redact(s.cfg.URL), err))
	}
	s.conn = conn
	return conn, nil
}

// declare makes the topic's exchange and the group's queue, bound, on ch.
func (s *Subscriber) declare(ch *amqp.Channel, topic string) (string, error) {
	if err := ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare exchange %s: %w", topic, err)
	}
	return declareGroupQueue(ch, topic, s.cfg.Consumer, s.cfg.QuorumQueues)
}

// Consumer names the consumer the subscriber reads for.
func (s *Subscriber) Consumer() string { return s.cfg.Consumer }

// Unacked is how many messages a subscription hands out before the first is acknowledged
// (SubscriberConfig.Unacked).
func (s *Subscriber) Unacked() int { return s.cfg.Unacked }

// SubscribeInitialize declares the topic's exchange and the group's queue, so that messages
// published before the first Subscribe are kept for the group.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	conn, err := s.connection()
	if err != nil {
		return fmt.Errorf("amqp subscriber: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp subscriber: open channel: %w", err)
	}
	defer ch.Close()
	_, err = s.declare(ch, topic)
	return err
}

// consume opens a channel with its prefetch and starts consuming the group's queue.
func (s *Subscriber) consume(topic string) (*amqp.Channel, <-chan amqp.Delivery, error) {
	conn, err := s.connection()
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	queue, err := s.declare(ch, topic)
	if err == nil {
		err = ch.Qos(s.cfg.Prefetch, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = ch.Close()
		return nil, nil, err
	}
	return ch, deliveries, nil
}

// Subscribe declares the queue and starts consuming before it returns, so a message published
// after it is delivered. The channel closes when ctx ends or the subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if !s.life.Enter(1) {
		return nil, errors.New("amqp subscriber is closed")
	}
	ch, deliveries, err := s.consume(topic)
	if err != nil {
		s.life.Leave()
		return nil, fmt.Errorf("amqp subscriber %s on %s: %w", s.cfg.Consumer, topic, err)
	}
	// With Unacked > 1 the channel holds what is handed out and not yet taken, so a consumer
	// busy with a batch finds the next one waiting.
	out := make(chan *message.Message, s.cfg.Unacked-1)
	window := make(chan struct{}, s.cfg.Unacked) // a slot per message handed out and not settled
	go func() {
		defer s.life.Leave()
		defer close(out)
		fields := watermill.LogFields{"topic": topic, "consumer": s.cfg.Consumer}
		for {
			s.forward(ctx, deliveries, out, window, fields)
			_ = ch.Close()
			if !s.reconnect(ctx, topic, fields, &ch, &deliveries) {
				return
			}
		}
	}()
	return out, nil
}

// forward hands deliveries to the consumer, up to Unacked at a time, until the subscription ends
// or the channel is lost.
func (s *Subscriber) forward(ctx context.Context, deliveries <-chan amqp.Delivery, out chan<- *message.Message,
	window chan struct{}, fields watermill.LogFields) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.life.Closing():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			if s.cfg.Unacked == 1 {
				if !s.deliver(ctx, d, out, fields) {
					return
				}
				continue
			}
			select { // a free slot in the window
			case window <- struct{}{}:
			case <-ctx.Done():
				_ = d.Nack(false, true)
				return
			case <-s.life.Closing():
				_ = d.Nack(false, true)
				return
			}
			if !s.handOut(ctx, d, out, window, fields) {
				return
			}
		}
	}
}

// handOut hands one delivery over without waiting for its settlement, which a goroutine of its
// own sends to the broker when the consumer acks or nacks (requeue when the subscription ends
// first) and then frees the delivery's slot in the window. False when the subscription ended.
func (s *Subscriber) handOut(ctx context.Context, d amqp.Delivery, out chan<- *message.Message, window chan struct{},
	fields watermill.LogFields) bool {
	msg := s.unmarshal(d, fields)
	mctx, cancel := context.WithCancel(ctx)
	msg.SetContext(outboxkit.WithConsumer(outboxkit.WithRedelivered(mctx, d.Redelivered), s.cfg.Consumer))
	select {
	case out <- msg:
	case <-ctx.Done():
		cancel()
		_ = d.Nack(false, true)
		<-window
		return false
	case <-s.life.Closing():
		cancel()
		_ = d.Nack(false, true)
		<-window
		return false
	}
	s.life.Go(func() {
		defer func() { <-window }()
		defer cancel()
		s.settle(ctx, d, msg, fields)
	})
	return true
}

// settle waits for the consumer's verdict on msg and sends it to the broker: ack on Ack, requeue
// on Nack or when the subscription ends first. False when the subscription ended.
func (s *Subscriber) settle(ctx context.Context, d amqp.Delivery, msg *message.Message, fields watermill.LogFields) bool {
	select {
	case <-msg.Acked():
		if err := d.Ack(false); err != nil {
			// The channel is gone: the broker requeues the message and it comes again.
			s.cfg.Logger.Info("Ack not sent, the message will be delivered again", fields.Add(watermill.LogFields{"err": err}))
		}
		return true
	case <-msg.Nacked():
		_ = d.Nack(false, true)
		return true
	case <-ctx.Done():
		_ = d.Nack(false, true)
		return false
	case <-s.life.Closing():
		_ = d.Nack(false, true)
		return false
	}
}

// deliver hands one delivery over and settles it: ack on Ack, requeue on Nack or when the
// subscription ends first. False when the subscription ended.
func (s *Subscriber) deliver(ctx context.Context, d amqp.Delivery, out chan<- *message.Message, fields watermill.LogFields) bool {
	msg := s.unmarshal(d, fields)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(outboxkit.WithConsumer(outboxkit.WithRedelivered(mctx, d.Redelivered), s.cfg.Consumer))
	select {
	case out <- msg:
	case <-ctx.Done():
		_ = d.Nack(false, true)
		return false
	case <-s.life.Closing():
		_ = d.Nack(false, true)
		return false
	}
	return s.settle(ctx, d, msg, fields)
}

// unmarshal reads a delivery in watermill-amqp's format, or one another producer wrote: without
// Watermill's UUID header the AMQP message_id (or the CloudEvents id) is the UUID, and the type,
// content_type and timestamp properties and the cloudEvents:* application properties fill in the
// event type, content type, creation time, partition key and trace context. A delivery it cannot
// read (Watermill's UUID header holding something else than a string) is handed out as it came
// (brokerio.Undecodable), for the consumer to dead-letter: rejected instead, it would be dropped
// by a queue without a dead-letter exchange, as outboxkit's queues are.
func (s *Subscriber) unmarshal(d amqp.Delivery, fields watermill.LogFields) *message.Message {
	msg, err := s.marshaler.Unmarshal(d)
	if err != nil {
		where := fmt.Sprintf("AMQP message (message_id %q) from exchange %s", d.MessageId, d.Exchange)
		logs.Warn(s.cfg.Logger, "Cannot read an AMQP delivery, handing it out to be dead-lettered", err,
			fields.Add(watermill.LogFields{"message_id": d.MessageId}))
		headers := make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			headers[k] = fmt.Sprint(v)
		}
		return brokerio.Undecodable(where, err, d.Body, headers, wamqp.MessageUUIDHeaderKey)
	}
	if msg.UUID == "" {
		msg.UUID = d.MessageId
	}
	brokerio.AdoptForeign(msg, func(name string) string {
		for _, prefix := range []string{brokerio.CEPrefixAMQP, "cloudEvents_"} { // binding 1.0.1+, and earlier
			if v, ok := d.Headers[prefix+name]; ok {
				return fmt.Sprint(v)
			}
		}
		switch name {
		case "type":
			return d.Type
		case "datacontenttype":
			return d.ContentType
		case "time":
			if !d.Timestamp.IsZero() {
				return d.Timestamp.UTC().Format(time.RFC3339Nano)
			}
		}
		return ""
	})
	return msg
}

// reconnect waits, with backoff, until the topic can be consumed again. False when the
// subscription ended first.
func (s *Subscriber) reconnect(ctx context.Context, topic string, fields watermill.LogFields,
	ch **amqp.Channel, deliveries *<-chan amqp.Delivery) bool {
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return false
		case <-s.life.Closing():
			return false
		default:
		}
		c, d, err := s.consume(topic)
		if err == nil {
			s.cfg.Logger.Info("Consuming again after a lost AMQP channel", fields)
			*ch, *deliveries = c, d
			return true
		}
		wait := s.cfg.Reconnect.Delay(attempt)
		s.cfg.Logger.Error("Cannot consume from AMQP, retrying", err, fields.Add(watermill.LogFields{"retry_in": wait}))
		select {
		case <-ctx.Done():
			return false
		case <-s.life.Closing():
			return false
		case <-time.After(wait):
		}
	}
}

// Close ends every subscription (what they hold is requeued), waits for them and closes the
// connection.
func (s *Subscriber) Close() error {
	return s.life.Close(func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.conn != nil && !s.conn.IsClosed() {
			return s.conn.CloseDeadline(time.Now().Add(s.cfg.DialTimeout))
		}
		return nil
	})
}

// stringifyHeaders turns the headers a non-Go producer set as AMQP types (numbers, booleans, tables)
// into strings, the only type Watermill's metadata holds.
func stringifyHeaders(d amqp.Delivery) amqp.Delivery {
	for k, v := range d.Headers {
		if _, ok := v.(string); !ok {
			d.Headers[k] = fmt.Sprint(v)
		}
	}
	return d
}
