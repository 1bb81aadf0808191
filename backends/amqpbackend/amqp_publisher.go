package amqpbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// PublisherConfig configures the RabbitMQ publisher. Topics map to durable fanout exchanges of the same
// name, as watermill-amqp's NewDurablePubSubConfig does, so watermill-amqp subscribers (see
// NewSubscriber) read what it publishes.
type PublisherConfig struct {
	// URL is the broker, e.g. amqp://guest:guest@127.0.0.1:5672/. Required.
	URL string
	// Channels is the number of confirm-mode channels concurrent publishes are spread over. Each
	// carries many messages in flight, so the broker can confirm them in batches. Default 4.
	Channels int
	// DialTimeout bounds a connection attempt. Default 5s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval, which detects a dead connection. Default 10s.
	Heartbeat time.Duration
	// Consumers names, per topic, the consumers whose queues ("<topic>_<consumer>", bound to the
	// topic's exchange) the publisher declares before it first publishes to the topic ("*": every
	// topic). A fanout exchange drops what no queue is bound to take, and mandatory publishing fails
	// only when no queue at all is bound: without this, a consumer whose queue does not exist yet
	// misses, silently, everything published before it first subscribes. Default: none.
	Consumers map[string][]string
	// QuorumQueues declares those queues as quorum queues; it must match the subscribers'
	// SubscriberConfig.QuorumQueues. Default false.
	QuorumQueues bool
	// ContentType is the content_type property of messages whose metadata names none
	// (outboxkit.MetadataContentType). Default: none.
	ContentType string
	// CloudEvents adds each message's CloudEvents attributes as cloudEvents:* application
	// properties (the AMQP binding's binary mode), for consumers using a CloudEvents SDK.
	// Default false.
	CloudEvents bool
	// CloudEventsSource is the source attribute. Default backends.DefaultCloudEventsSource.
	CloudEventsSource string
	// Logger receives connection events. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

// Publisher publishes to RabbitMQ with publisher confirms: Publish returns only after the
// broker has confirmed every message, persistent, to durable queues. It is safe for concurrent use,
// and concurrent calls are pipelined: they share a few channels, each call waiting only for the
// confirms of its own messages. Messages of one call are published in order on one channel.
//
// Messages are published mandatory, the UUID is the AMQP message_id, the event type the type,
// the content type (metadata, or ContentType) the content_type, the outbox row's creation time the
// timestamp, and metadata travels as headers in watermill-amqp's format (plus cloudEvents:*
// properties with CloudEvents). Errors that mean the broker could not be reached (no
// connection, connection lost, no confirm before the message context's deadline, a negative
// confirm) are marked outboxkit.Unreachable; a refusal of the message (unroutable, a channel-level
// exception such as an oversized message) is not.
//
// It is built on watermill-amqp v3's marshaler and naming, but publishes itself because
// watermill-amqp's publisher cannot carry the guarantees above: it waits for each confirm without
// a deadline, drops basic.return so a mandatory message is lost silently when unroutable, its
// channel pool loses a channel whenever reopening one fails mid-outage (until Publish blocks for
// good), and with one confirm in flight per channel the broker caps it near 12k msg/s on a
// machine where pipelined confirms reach 27k.
type Publisher struct {
	cfg       PublisherConfig
	marshaler wamqp.DefaultMarshaler
	wire      brokerio.Wire

	mu       sync.Mutex
	conn     *amqp.Connection
	gen      uint64 // connection generation: channels and declarations belong to one
	declared map[string]bool
	slots    []*sharedChannel
	next     int
	lastDial time.Time
	lastErr  error
	closed   bool
}

// NewPublisher builds the publisher. A malformed URL fails here; the connection is made on the
// first Publish (an unreachable broker is then an unreachable error, and the forwarder's circuit
// waits for it), so a process starts while its broker is down.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqp publisher: URL is required, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("amqp publisher: URL %q: %w (want amqp://user:pass@host:5672/vhost)", brokerio.Redact(cfg.URL), err)
	}
	if cfg.Channels == 0 {
		cfg.Channels = 4
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
	if cfg.Channels < 0 || cfg.DialTimeout < 0 || cfg.Heartbeat < 0 {
		return nil, errors.New("amqp publisher: Channels, DialTimeout and Heartbeat must not be negative")
	}
	for topic, consumers := range cfg.Consumers {
		for _, c := range consumers {
			if c == "" {
				return nil, fmt.Errorf("amqp publisher: Consumers[%q] holds an empty consumer name", topic)
			}
		}
	}
	wire := brokerio.NewWire(backends.Options{CloudEvents: cfg.CloudEvents, CloudEventsSource: cfg.CloudEventsSource, ContentType: cfg.ContentType})
	return &Publisher{cfg: cfg, wire: wire, slots: make([]*sharedChannel, cfg.Channels)}, nil
}

// Publish sends the messages to the exchange named topic and waits for the broker's confirms,
// bounded by the first message's context. On error, some messages of the call may have been
// published: the caller retries them, and consumers deduplicate on the UUID.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	if err := p.declare(ctx, topic); err != nil {
		return markAccessDenied(err)
	}
	sc, err := p.channel(ctx)
	if err != nil {
		return outboxkit.Unreachable(err)
	}

	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	defer sc.untrack(confirms)
	for _, msg := range msgs {
		pub, err := p.marshaler.Marshal(msg)
		if err != nil {
			return fmt.Errorf("marshal message %s: %w", msg.UUID, err)
		}
		p.properties(topic, msg, &pub)
		dc, err := sc.ch.PublishWithDeferredConfirmWithContext(ctx, topic, "", true, false, pub)
		if err != nil {
			if ctx.Err() != nil {
				return outboxkit.Unreachable(fmt.Errorf("publish message %s: %w", msg.UUID, err))
			}
			return sc.failure(0, fmt.Errorf("publish message %s: %w", msg.UUID, err))
		}
		sc.track(dc)
		confirms = append(confirms, dc)
	}

	for i, dc := range confirms {
		select {
		case <-dc.Done():
		case <-ctx.Done():
			// No confirm in time: the connection is suspect (a black hole does not answer a channel
			// close either), so drop it under a deadline; the next publish reconnects.
			p.dropConnection(sc.gen)
			return outboxkit.Unreachable(fmt.Errorf("no confirm for message %s: %w", msgs[i].UUID, ctx.Err()))
		}
		if !dc.Acked() {
			return sc.failure(dc.DeliveryTag, fmt.Errorf("broker did not confirm message %s", msgs[i].UUID))
		}
	}
	// A return precedes its confirm on the channel, so every return for these messages is in.
	var unroutable []string
	for _, msg := range msgs {
		if sc.takeReturn(msg.UUID) {
			unroutable = append(unroutable, msg.UUID)
		}
	}
	if len(unroutable) > 0 {
		// Unroutable now is unroutable on every retry until a queue is bound: dead-lettered at once
		// (and replayable), rather than retried for minutes. Options.Consumers declares the
		// consumers' queues before the first publish, so that this does not happen to them.
		return outboxkit.Permanent(fmt.Errorf("publish to exchange %q: messages %s: %w", topic, strings.Join(unroutable, ", "), ErrUnroutable))
	}
	return nil
}

// properties sets the AMQP properties other clients read: message_id, type, content_type,
// timestamp, and the CloudEvents application properties when asked for.
func (p *Publisher) properties(topic string, msg *message.Message, pub *amqp.Publishing) {
	pub.MessageId = msg.UUID
	pub.DeliveryMode = amqp.Persistent
	pub.Type = outboxkit.EventType(msg)
	pub.ContentType = p.wire.MessageContentType(msg)
	pub.Timestamp = time.Now()
	if created, ok := outboxkit.CreatedAt(msg); ok {
		pub.Timestamp = created
	}
	for name, v := range p.wire.CEAttributes(topic, msg) {
		if name != "datacontenttype" { // the binding carries it as content_type
			pub.Headers[brokerio.CEPrefixAMQP+name] = v
		}
	}
}

// connection returns the live connection, dialing when there is none. After a failed dial it
// fails fast for a second instead of queueing every caller behind another dial timeout.
func (p *Publisher) connection() (*amqp.Connection, uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connectionLocked(false)
}

// connectionLocked is connection with p.mu held; redial dials even within a second of a failed
// dial (for Check, whose caller is one relay watching the broker, not a queue of publishes).
func (p *Publisher) connectionLocked(redial bool) (*amqp.Connection, uint64, error) {
	if p.closed {
		return nil, 0, errors.New("amqp publisher is closed")
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, p.gen, nil
	}
	if !redial && p.lastErr != nil && time.Since(p.lastDial) < time.Second {
		return nil, 0, p.lastErr
	}
	p.lastDial = time.Now()
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		Heartbeat:  p.cfg.Heartbeat,
		Properties: amqp.Table{"connection_name": "outboxkit-publisher"},
		Dial:       amqp.DefaultDial(p.cfg.DialTimeout),
	})
	if err != nil {
		p.lastErr = markAccessDenied(fmt.Errorf("connect to %s: %w", brokerio.Redact(p.cfg.URL), err))
		return nil, 0, p.lastErr
	}
	if p.conn != nil {
		p.cfg.Logger.Info("Reconnected to AMQP", nil)
	}
	p.conn, p.lastErr = conn, nil
	p.gen++
	p.declared = map[string]bool{}
	return conn, p.gen, nil
}

// channel returns one of the shared channels, round robin, opening it when it is missing, closed,
// or from an older connection.
func (p *Publisher) channel(ctx context.Context) (*sharedChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, gen, err := p.connectionLocked(false)
	if err != nil {
		return nil, err
	}
	i := p.next % len(p.slots)
	p.next++
	if sc := p.slots[i]; sc != nil && sc.gen == gen && !sc.ch.IsClosed() {
		return sc, nil
	}
	var ch *amqp.Channel
	err = p.rpc(ctx, conn, func() error {
		var err error
		if ch, err = conn.Channel(); err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return fmt.Errorf("enable publisher confirms: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sc := &sharedChannel{
		ch:       ch,
		gen:      gen,
		returns:  ch.NotifyReturn(make(chan amqp.Return, 1024)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		returned: map[string]amqp.Return{},
		inflight: map[uint64]*amqp.DeferredConfirmation{},
	}
	p.slots[i] = sc
	return sc, nil
}

// declare makes sure the topic's exchange exists, and the queues of the consumer groups declared
// for it (Consumers), once per connection. It uses a channel of its own, so that a refused
// declaration (the exchange exists with another type) closes that channel only, and is reported as
// a message error: the topic is misconfigured, the broker is fine.
func (p *Publisher) declare(ctx context.Context, exchange string) error {
	conn, gen, err := p.connection()
	if err != nil {
		return outboxkit.Unreachable(err)
	}
	p.mu.Lock()
	done := p.declared[exchange]
	p.mu.Unlock()
	if done {
		return nil
	}
	err = p.rpc(ctx, conn, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return outboxkit.Unreachable(fmt.Errorf("open channel: %w", err))
		}
		defer ch.Close() // closed by the broker already when a declaration failed
		if err := ch.ExchangeDeclare(exchange, "fanout", true, false, false, false, nil); err != nil {
			return err
		}
		for _, group := range brokerio.ConsumersOf(p.cfg.Consumers, exchange) {
			if _, err := declareGroupQueue(ch, exchange, group, p.cfg.QuorumQueues); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Recover && !conn.IsClosed() {
			return fmt.Errorf("declare exchange %q: %w", exchange, err)
		}
		return outboxkit.Unreachable(fmt.Errorf("declare exchange %q: %w", exchange, err))
	}
	p.mu.Lock()
	if gen == p.gen {
		p.declared[exchange] = true
	}
	p.mu.Unlock()
	return nil
}

// rpc runs a synchronous broker call (they take no context in amqp091) under ctx. When ctx ends
// first, the connection is closed under a deadline, which makes the call return: nothing waits
// beyond ctx for a broker that does not answer, and no goroutine outlives rpc.
func (p *Publisher) rpc(ctx context.Context, conn *amqp.Connection, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		if !conn.IsClosed() {
			_ = conn.CloseDeadline(time.Now().Add(time.Second))
		}
		<-done //nolint:errcheck // the call's error is then the closed connection's: ctx's end is the cause to report
		return outboxkit.Unreachable(fmt.Errorf("broker did not answer: %w", ctx.Err()))
	}
}

// dropConnection closes connection generation gen under a deadline, failing every publish on it.
func (p *Publisher) dropConnection(gen uint64) {
	p.mu.Lock()
	conn := p.conn
	current := gen == p.gen
	p.mu.Unlock()
	if current && conn != nil && !conn.IsClosed() {
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
	}
}

// Check connects when there is no live connection: an error says the broker is unreachable, or
// refuses the credentials or the virtual host (outboxkit.IsAccessDenied). The relay calls it at
// start, and every forwarder.Config.CircuitWatch while the broker is away, so it dials each time
// it is called (publishes dial at most once a second).
func (p *Publisher) Check(ctx context.Context) error {
	p.mu.Lock()
	_, _, err := p.connectionLocked(true)
	p.mu.Unlock()
	if err != nil {
		if outboxkit.IsAccessDenied(err) {
			return err
		}
		return outboxkit.Unreachable(err)
	}
	return nil
}

// Close closes the connection. Publishes in progress fail as unreachable.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn.CloseDeadline(time.Now().Add(p.cfg.DialTimeout))
	}
	return nil
}
