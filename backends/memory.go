package backends

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// openMemory is Watermill's GoChannel: in-process, nothing survives the process. Every
// subscription gets every message; there are no competing consumers, and no order: GoChannel
// hands each message to each subscription in a goroutine of its own (its ordered mode makes a
// publish wait for every subscription's ack, which stalls the relay behind the slowest consumer).
// For demos and tests.
func openMemory(rawURL string, opts Options) (*Backend, error) {
	if rawURL != "memory://" {
		return nil, errors.New("memory:// takes nothing after the scheme")
	}
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true, OutputChannelBuffer: 1024}, opts.Logger)
	return &Backend{
		Publisher: metadataFormat{Publisher: bus, wire: newWireFormat(opts)},
		newSubscriber: func(string) (Subscriber, error) {
			s := &memorySubscriber{bus: bus}
			s.outlets.transform = func(msg *message.Message) { adoptForeign(msg, metadataAttrs(msg.Metadata, cePrefixOther, "")) }
			return s, nil
		},
		closers: []func() error{bus.Close},
	}, nil
}

// memorySubscriber is one consumer's view of the shared bus: closing it ends its own
// subscriptions, while the bus lives on until the backend is closed.
type memorySubscriber struct {
	bus     *gochannel.GoChannel
	mu      sync.Mutex
	cancels []context.CancelFunc
	closed  bool
	outlets outlets // GoChannel closes a cancelled subscription's channel later, in a goroutine of its own
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
	return s.outlets.outlet(ctx, in), nil
}

// SubscribeInitialize does nothing: the bus is persistent, a later subscription gets what was
// published before it.
func (s *memorySubscriber) SubscribeInitialize(string) error { return nil }

func (s *memorySubscriber) Close() error {
	return s.outlets.close(func() error {
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
