// Package backends builds Watermill publishers and subscribers for each broker outboxkit relays
// to, with the settings at-least-once delivery needs switched on.
package backends

import (
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
)

// AMQPConfig configures the RabbitMQ publisher. Topics map to durable fanout exchanges of the same
// name, as watermill-amqp's NewDurablePubSubConfig does, so watermill-amqp subscribers (see
// NewAMQPSubscriber) read what it publishes.
type AMQPConfig struct {
	// URL is the broker, e.g. amqp://guest:guest@127.0.0.1:5672/. Required.
	URL string
	// MaxIdleChannels bounds the confirm-mode channels kept open between publishes. Concurrent
	// publishes each use a channel of their own. Default 64.
	MaxIdleChannels int
	// DialTimeout bounds a connection attempt. Default 5s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval, which detects a dead connection. Default 10s.
	Heartbeat time.Duration
	// Logger receives connection events. Default: none.
	Logger watermill.LoggerAdapter
}

// ErrUnroutable is returned (wrapped) when the broker could not route a message to any queue:
// nothing is bound to the topic's exchange. The message was not stored anywhere.
var ErrUnroutable = errors.New("unroutable: no queue is bound to the exchange")

// AMQPPublisher publishes to RabbitMQ with publisher confirms: Publish returns only after the
// broker has confirmed every message, persistent, to durable queues. It is safe for concurrent use.
//
// Messages are published mandatory, the UUID is the AMQP message_id, and metadata travels as
// headers in watermill-amqp's format. Errors that mean the broker could not be reached (no
// connection, connection lost, no confirm before the message context's deadline, a negative
// confirm) are marked outboxkit.Transport; a refusal of the message (unroutable, a channel-level
// exception such as an oversized message) is not.
//
// It is built on watermill-amqp v3's marshaler and naming, but publishes itself because
// watermill-amqp's publisher cannot carry the guarantees above: it waits for each confirm without
// a deadline, drops basic.return so a mandatory message is lost silently when unroutable, and its
// channel pool loses a channel whenever reopening one fails mid-outage, until Publish blocks for
// good. This publisher pipelines the messages of a call on one channel and waits for their
// confirms under the message context.
type AMQPPublisher struct {
	cfg       AMQPConfig
	marshaler wamqp.DefaultMarshaler

	mu       sync.Mutex
	conn     *amqp.Connection
	gen      uint64 // connection generation: channels and declarations belong to one
	declared map[string]bool
	idle     []*confirmChannel
	lastDial time.Time
	lastErr  error
	closed   bool
}

type confirmChannel struct {
	ch      *amqp.Channel
	gen     uint64
	returns chan amqp.Return
	closes  chan *amqp.Error
}

// NewAMQPPublisher builds the publisher and connects once, so a wrong URL fails here.
func NewAMQPPublisher(cfg AMQPConfig) (*AMQPPublisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqp publisher: URL is required, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("amqp publisher: URL %q: %w (want amqp://user:pass@host:5672/vhost)", redact(cfg.URL), err)
	}
	if cfg.MaxIdleChannels == 0 {
		cfg.MaxIdleChannels = 64
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.MaxIdleChannels < 0 || cfg.DialTimeout < 0 || cfg.Heartbeat < 0 {
		return nil, errors.New("amqp publisher: MaxIdleChannels, DialTimeout and Heartbeat must not be negative")
	}
	p := &AMQPPublisher{cfg: cfg}
	if _, _, err := p.connection(); err != nil {
		return nil, fmt.Errorf("amqp publisher: %w", err)
	}
	return p, nil
}

// Publish sends the messages to the exchange named topic and waits for the broker's confirms,
// bounded by the first message's context. On error, some messages of the call may have been
// published: the caller retries them, and consumers deduplicate on the UUID.
func (p *AMQPPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	c, err := p.acquire()
	if err != nil {
		return outboxkit.Transport(err)
	}
	healthy := false
	defer func() {
		if healthy {
			p.release(c)
		} else {
			p.discard(c)
		}
	}()
	if err := p.declare(c, topic); err != nil {
		return p.classify(c, fmt.Errorf("declare exchange %q: %w", topic, err))
	}

	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, msg := range msgs {
		pub, err := p.marshaler.Marshal(msg)
		if err != nil {
			healthy = i == 0 // nothing was sent on the channel yet
			return fmt.Errorf("marshal message %s: %w", msg.UUID, err)
		}
		pub.MessageId = msg.UUID
		pub.DeliveryMode = amqp.Persistent
		confirms[i], err = c.ch.PublishWithDeferredConfirmWithContext(ctx, topic, "", true, false, pub)
		if err != nil {
			return p.classify(c, fmt.Errorf("publish message %s: %w", msg.UUID, err))
		}
	}

	// A return precedes its confirm on the channel, so once every confirm is in, every return for
	// these messages has been received. Draining returns while waiting keeps the connection's
	// reader from blocking on a full returns channel.
	var unroutable []string
	collect := func(r amqp.Return) {
		unroutable = append(unroutable, r.MessageId)
	}
	for i, dc := range confirms {
	wait:
		for {
			select {
			case <-dc.Done():
				break wait
			case r := <-c.returns:
				collect(r)
			case <-ctx.Done():
				return outboxkit.Transport(fmt.Errorf("no confirm for message %s: %w", msgs[i].UUID, ctx.Err()))
			}
		}
		if !dc.Acked() {
			return p.classify(c, fmt.Errorf("broker did not confirm message %s", msgs[i].UUID))
		}
	}
	for drained := false; !drained; {
		select {
		case r := <-c.returns:
			collect(r)
		default:
			drained = true
		}
	}
	healthy = true
	if len(unroutable) > 0 {
		return fmt.Errorf("publish to exchange %q: messages %s: %w", topic, strings.Join(unroutable, ", "), ErrUnroutable)
	}
	return nil
}

// classify decides whether a failure on channel c is the message's fault or the broker's.
// A channel closed by a soft exception (406 precondition failed, 404 not found, 403 access
// refused…) refused this message or topic; anything else means the broker was not reachable.
func (p *AMQPPublisher) classify(c *confirmChannel, err error) error {
	select {
	case e := <-c.closes:
		if e != nil && e.Recover && !p.connClosed() {
			return fmt.Errorf("%w: broker closed the channel: %s (%d)", err, e.Reason, e.Code)
		}
		if e != nil {
			return outboxkit.Transport(fmt.Errorf("%w: %s (%d)", err, e.Reason, e.Code))
		}
	default:
	}
	return outboxkit.Transport(err)
}

func (p *AMQPPublisher) connClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn == nil || p.conn.IsClosed()
}

// connection returns the live connection, dialing when there is none. After a failed dial it
// fails fast for a second instead of queueing every caller behind another dial timeout.
func (p *AMQPPublisher) connection() (*amqp.Connection, uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, 0, errors.New("amqp publisher is closed")
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, p.gen, nil
	}
	if p.lastErr != nil && time.Since(p.lastDial) < time.Second {
		return nil, 0, p.lastErr
	}
	p.lastDial = time.Now()
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		Heartbeat:  p.cfg.Heartbeat,
		Properties: amqp.Table{"connection_name": "outboxkit-publisher"},
		Dial:       amqp.DefaultDial(p.cfg.DialTimeout),
	})
	if err != nil {
		p.lastErr = fmt.Errorf("connect to %s: %w", redact(p.cfg.URL), err)
		return nil, 0, p.lastErr
	}
	if p.conn != nil {
		p.cfg.Logger.Info("Reconnected to AMQP", nil)
	}
	p.conn, p.lastErr = conn, nil
	p.gen++
	p.declared = map[string]bool{}
	for _, c := range p.idle {
		_ = c.ch.Close()
	}
	p.idle = nil
	return conn, p.gen, nil
}

func (p *AMQPPublisher) acquire() (*confirmChannel, error) {
	conn, gen, err := p.connection()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if c.gen == gen && !c.ch.IsClosed() {
			p.mu.Unlock()
			return c, nil
		}
		_ = c.ch.Close()
	}
	p.mu.Unlock()

	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return &confirmChannel{
		ch:      ch,
		gen:     gen,
		returns: ch.NotifyReturn(make(chan amqp.Return, 256)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

func (p *AMQPPublisher) release(c *confirmChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || c.gen != p.gen || len(p.idle) >= p.cfg.MaxIdleChannels {
		_ = c.ch.Close()
		return
	}
	p.idle = append(p.idle, c)
}

// discard drops a channel after a failure. One the broker closed is gone already. One still open
// is in an unknown state (no confirm in time, a negative confirm) and so is its connection: closing
// the channel is an RPC that would wait for a broker that may not answer, so the whole connection
// is closed under a deadline instead, and the next publish reconnects.
func (p *AMQPPublisher) discard(c *confirmChannel) {
	if c.ch.IsClosed() {
		return
	}
	p.mu.Lock()
	conn, gen := p.conn, p.gen
	p.mu.Unlock()
	if conn != nil && c.gen == gen && !conn.IsClosed() {
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
	}
}

func (p *AMQPPublisher) declare(c *confirmChannel, exchange string) error {
	p.mu.Lock()
	done := p.declared[exchange] && c.gen == p.gen
	p.mu.Unlock()
	if done {
		return nil
	}
	if err := c.ch.ExchangeDeclare(exchange, "fanout", true, false, false, false, nil); err != nil {
		return err
	}
	p.mu.Lock()
	if c.gen == p.gen {
		p.declared[exchange] = true
	}
	p.mu.Unlock()
	return nil
}

// Close closes the connection. Publishes in progress fail with a transport error.
func (p *AMQPPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, c := range p.idle {
		_ = c.ch.Close()
	}
	p.idle = nil
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn.CloseDeadline(time.Now().Add(p.cfg.DialTimeout))
	}
	return nil
}

// AMQPSubscriberConfig configures a consumer group on RabbitMQ.
type AMQPSubscriberConfig struct {
	// URL is the broker. Required.
	URL string
	// ConsumerGroup names the consumer (Shipping, Billing…). Each group has its own durable queue,
	// named "<topic>_<group>", bound to the topic's exchange, so every group gets every message.
	// Required.
	ConsumerGroup string
	// Prefetch is how many unacknowledged messages the broker hands over at once. Default 16.
	Prefetch int
	// Logger receives watermill-amqp's logs. Default: none.
	Logger watermill.LoggerAdapter
}

// NewAMQPSubscriber builds a watermill-amqp subscriber for one consumer group. A nacked message is
// requeued and delivered again. Headers RabbitMQ adds that are not strings (x-delivery-count on
// quorum queues, x-death after dead-lettering) are turned into strings instead of failing the
// whole delivery.
func NewAMQPSubscriber(cfg AMQPSubscriberConfig) (message.Subscriber, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqp subscriber: URL is required, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if cfg.ConsumerGroup == "" {
		return nil, errors.New("amqp subscriber: ConsumerGroup is required: name the consuming service (e.g. \"shipping\")")
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = 16
	}
	wcfg := wamqp.NewDurablePubSubConfig(cfg.URL, wamqp.GenerateQueueNameTopicNameWithSuffix(cfg.ConsumerGroup))
	wcfg.Consume.Qos.PrefetchCount = cfg.Prefetch
	wcfg.Connection.Reconnect = &wamqp.ReconnectConfig{
		BackoffInitialInterval: 200 * time.Millisecond, BackoffMultiplier: 2, BackoffMaxInterval: 5 * time.Second,
	}
	wcfg.Marshaler = wamqp.DefaultMarshaler{PreprocessDelivery: stringifyHeaders}
	return wamqp.NewSubscriber(wcfg, cfg.Logger)
}

func stringifyHeaders(d amqp.Delivery) amqp.Delivery {
	for k, v := range d.Headers {
		if _, ok := v.(string); !ok {
			d.Headers[k] = fmt.Sprint(v)
		}
	}
	return d
}

// redact hides the password of a URL for error messages.
func redact(raw string) string {
	if u, err := amqp.ParseURI(raw); err == nil && u.Password != "" {
		return strings.Replace(raw, ":"+u.Password+"@", ":***@", 1)
	}
	return raw
}
