// Package memorybackend is Watermill's in-process GoChannel as a broker, for demos and tests:
// nothing survives the process. It registers memory:// with backends.Open.
package memorybackend

import (
	"context"
	"errors"
	"sync"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// openMemory is Watermill's GoChannel: in-process, nothing survives the process. Every
// subscription gets every message; there are no competing consumers, and no order: GoChannel
// hands each message to each subscription in a goroutine of its own (its ordered mode makes a
// publish wait for every subscription's ack, which stalls the relay behind the slowest consumer).
// For demos and tests.
func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	if rawURL != "memory://" {
		return backends.Parts{}, errors.New("memory:// takes nothing after the scheme")
	}
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true, OutputChannelBuffer: 1024}, opts.Logger)
	return backends.Parts{
		Publisher: brokerio.MetadataFormat{Publisher: bus, Wire: brokerio.NewWire(opts)},
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			s := &memorySubscriber{bus: bus, consumer: group}
			s.outlets.Consumer = group
			s.outlets.Transform = func(msg *message.Message) {
				brokerio.AdoptForeign(msg, brokerio.MetadataAttrs(msg.Metadata, brokerio.CEPrefixOther, ""))
			}
			return s, nil
		},
		Close: []func() error{bus.Close},
	}, nil
}

// memorySubscriber is one consumer's view of the shared bus: closing it ends its own
// subscriptions, while the bus lives on until the backend is closed.
type memorySubscriber struct {
	bus      *gochannel.GoChannel
	consumer string
	mu       sync.Mutex
	cancels  []context.CancelFunc
	closed   bool
	outlets  brokerio.Outlets // GoChannel closes a cancelled subscription's channel later, in a goroutine of its own
}

func (s *memorySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("memory subscriber is closed")
	}
	ctx, cancel := context.WithCancel(ctx)
	s.cancels = append(s.cancels, cancel)
	in, err := s.bus.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	return s.outlets.Outlet(ctx, in), nil
}

// Consumer names the consumer the subscriber reads for.
func (s *memorySubscriber) Consumer() string { return s.consumer }

// SubscribeInitialize does nothing: the bus is persistent, a later subscription gets what was
// published before it.
func (s *memorySubscriber) SubscribeInitialize(string) error { return nil }

func (s *memorySubscriber) Close() error {
	return s.outlets.Close(func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		for _, cancel := range s.cancels {
			cancel()
		}
		s.cancels = nil
		return nil
	})
}

func init() {
	backends.Register(open, "memory:// (in-process, for demos and tests)", "memory")
}
