package brokerio

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// Outlets hands each subscription out through a channel of its own, so that a subscriber's Close
// returns only once every channel it handed out is closed - Watermill's Subscriber contract, on
// which a router draining its channels after Close relies. Messages pass one by one, unbuffered
// unless Buffer says otherwise: acks and nacks reach the library's own message unchanged. The zero
// value is ready to use.
type Outlets struct {
	// Buffer is how many messages a channel holds that the consumer has not taken yet: a batching
	// consumer then finds waiting what the library's subscriber handed out. Default 0.
	Buffer int
	// Transform, when set, is applied to each message before it is handed out.
	Transform func(*message.Message)
	// Consumer, when set, is stamped on each message's context (outboxkit.WithConsumer).
	Consumer string

	once, closeOnce sync.Once
	closing         chan struct{}
	wg              sync.WaitGroup
}

func (r *Outlets) init() { r.once.Do(func() { r.closing = make(chan struct{}) }) }

// Outlet returns a channel that carries in's messages and is closed when in is, when ctx ends, or
// when close is called.
func (r *Outlets) Outlet(ctx context.Context, in <-chan *message.Message) <-chan *message.Message {
	pending := make(chan (<-chan *message.Message), 1)
	pending <- in
	close(pending)
	return r.OutletLater(ctx, pending)
}

// OutletLater is Outlet for a subscription made later: it carries the messages of the channel that
// arrives on pending, and closes when pending closes empty, ctx ends, or close is called.
func (r *Outlets) OutletLater(ctx context.Context, pending <-chan (<-chan *message.Message)) <-chan *message.Message {
	r.init()
	out := make(chan *message.Message, r.Buffer)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(out)
		var in <-chan *message.Message
		select {
		case got, ok := <-pending:
			if !ok {
				return
			}
			in = got
		case <-r.closing:
			return
		case <-ctx.Done():
			return
		}
		for msg := range in {
			if r.Transform != nil {
				r.Transform(msg)
			}
			if r.Consumer != "" {
				msg.SetContext(outboxkit.WithConsumer(msg.Context(), r.Consumer))
			}
			select {
			case out <- msg:
			case <-r.closing:
				// Never handed over and never acked: the library redelivers it (or, for the
				// in-memory bus, it ends with the subscription, as it would have anyway).
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (r *Outlets) Closing() <-chan struct{} { r.init(); return r.closing }

func (r *Outlets) IsClosing() bool {
	select {
	case <-r.Closing():
		return true
	default:
		return false
	}
}

// Close stops handing messages out, closes the library's subscriber and waits until every
// channel from relay is closed.
func (r *Outlets) Close(closeInner func() error) error {
	r.init()
	r.closeOnce.Do(func() { close(r.closing) })
	err := closeInner()
	r.wg.Wait()
	return err
}
