package natsbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// natsPublisher makes sure a topic's stream exists before publishing to it, so that messages are
// kept even before any consumer has subscribed, as with a Kafka topic, and publishes each message
// with Nats-Msg-Id = its UUID (outboxkit.BrokerDedupID: a replay gets an id of its own), waiting
// for the stream's ack within the message's context.
//
// It replaces watermill-nats's JetStream publisher, which publishes to a subject named after the
// stream rather than the topic (a topic holding '.' - "orders.placed" - lands on no stream: "no
// response from stream") and waits for acks without the message's deadline. The wire format is
// the same (its NATSMarshaler), so watermill-nats subscribers read what this publishes.
type natsPublisher struct {
	connect      func() (jetstream.JetStream, error) // on the first Publish
	wire         brokerio.Wire
	streamConfig func(string) jetstream.StreamConfig
	marshaler    wmnats.NATSMarshaler
	mu           sync.Mutex
	js           jetstream.JetStream
	closed       bool
	ensured      map[string]bool
}

func (p *natsPublisher) jetStream() (jetstream.JetStream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("nats publisher is closed")
	}
	if p.js == nil {
		js, err := p.connect()
		if err != nil {
			return nil, outboxkit.Unreachable(err)
		}
		p.js = js
	}
	return p.js, nil
}

func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	js, err := p.jetStream()
	if err != nil {
		return err
	}
	if nc := js.Conn(); !nc.IsConnected() {
		// Waiting for the reconnect would hold the relay's pass for its whole deadline with its
		// circuit still closed; failing now opens it, and the relay probes.
		return outboxkit.Unreachable(fmt.Errorf("publish to %s: not connected to NATS (%v): %w", topic, nc.Status(), nats.ErrDisconnected))
	}
	p.mu.Lock()
	done := p.ensured[topic]
	p.mu.Unlock()
	if !done {
		ctx := context.Background()
		if len(msgs) > 0 {
			ctx = msgs[0].Context()
		}
		if _, err := js.CreateOrUpdateStream(ctx, p.streamConfig(topic)); err != nil {
			return classifyNATS(fmt.Errorf("stream for %s: %w", topic, err))
		}
		p.mu.Lock()
		p.ensured[topic] = true
		p.mu.Unlock()
	}
	for _, m := range msgs {
		nm, err := p.marshaler.Marshal(topic, m)
		if err != nil {
			return fmt.Errorf("marshal message %s: %w", m.UUID, err)
		}
		if nm.Header == nil {
			nm.Header = nats.Header{}
		}
		nm.Header.Set(nats.MsgIdHdr, outboxkit.BrokerDedupID(m))
		for name, v := range p.wire.CEAttributes(topic, m) {
			if name == "datacontenttype" {
				nm.Header.Set(brokerio.CEContentType, v)
			} else {
				nm.Header.Set(brokerio.CEPrefixNATS+name, v)
			}
		}
		ack, err := js.PublishMsg(m.Context(), nm)
		if err != nil {
			return classifyNATS(fmt.Errorf("publish %s to %s: %w", m.UUID, topic, err))
		}
		if ack.Duplicate && m.Metadata.Get(outboxkit.MetadataReplay) != "" {
			// A relay's re-publish that JetStream drops is fine (the stream has the message); a
			// replay it drops would be a replay that silently did nothing.
			return fmt.Errorf("publish %s to %s: JetStream dropped the replay as a duplicate of id %s", m.UUID, topic, outboxkit.BrokerDedupID(m))
		}
	}
	return nil
}

// Check connects, and waits (until ctx ends) for the connection to be made or refused: an error
// says the server is unreachable, or refuses the credentials (outboxkit.IsAccessDenied).
func (p *natsPublisher) Check(ctx context.Context) error {
	js, err := p.jetStream()
	if err != nil {
		return err
	}
	nc := js.Conn()
	for !nc.IsConnected() {
		if last := nc.LastError(); last != nil {
			// The connection was tried and failed: refused credentials, or a server not there.
			if err := classifyNATS(last); outboxkit.IsAccessDenied(err) {
				return err
			}
			return outboxkit.Unreachable(fmt.Errorf("not connected to NATS (%v): %w", nc.Status(), last))
		}
		select {
		case <-ctx.Done():
			last := nc.LastError()
			if last == nil {
				last = nats.ErrNoServers
			}
			return classifyNATS(outboxkit.Unreachable(fmt.Errorf("not connected to NATS (%v): %w", nc.Status(), last)))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Close closes the publisher's connection, if it made one.
func (p *natsPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.js != nil {
		p.js.Conn().Close()
	}
	return nil
}
