package pg

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/store"
)

// ErrHubClosed is reported to a relay that listens through a hub already closed: it polls.
var ErrHubClosed = errors.New("the shared wake-up listener is closed: relays of this store poll until they restart with an open one")

// Hub is one LISTEN connection shared by the relays of many schemas of one database, where a
// listener per store would hold a connection per schema. Its goroutine holds the connection
// while at least one relay listens, LISTENs on each listening schema's channel (and UNLISTENs
// when the last of a schema's relays stops), hands every notification to the relays of its
// channel, and reconnects after a failure, telling every relay it listens again (notifications
// sent meanwhile are lost). Callbacks run on the hub's goroutine and must not block.
type Hub struct {
	connect func(ctx context.Context) (*pgx.Conn, error)
	retry   time.Duration

	mu      sync.Mutex
	subs    map[string]map[*hubSub]struct{} // by channel
	closed  bool
	changed chan struct{} // the relays listening changed (holds one signal at most)

	cancel context.CancelFunc
	done   chan struct{}
}

// hubSub is one relay's Listen.
type hubSub struct {
	mu              sync.Mutex
	gone            bool // Listen returned: no callback runs any more
	told            bool // listening was called for the hub's current connection (hub's goroutine only)
	wake, listening func()
	logErr          func(error)
}

// call runs fn unless the relay's Listen has returned.
func (s *hubSub) call(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.gone {
		fn()
	}
}

// NewHub starts a hub that opens its connection with connect, and waits retry before opening it
// again after a failure (2s when 0). Close stops it.
func NewHub(connect func(ctx context.Context) (*pgx.Conn, error), retry time.Duration) *Hub {
	if retry <= 0 {
		retry = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{connect: connect, retry: retry, subs: map[string]map[*hubSub]struct{}{}, changed: make(chan struct{}, 1),
		cancel: cancel, done: make(chan struct{})}
	go h.run(ctx)
	return h
}

// Close stops the hub's goroutine and closes its connection, and returns once both are done.
// Relays listening through it poll from then on. It is safe to call more than once.
func (h *Hub) Close() {
	h.mu.Lock()
	first := !h.closed
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	<-h.done
	if first {
		h.each("", func(s *hubSub) { s.call(func() { s.logErr(ErrHubClosed) }) })
	}
}

// Waker is the store.Waker of the relays of channel, through the hub.
func (h *Hub) Waker(channel string) store.Waker { return hubWaker{h: h, channel: channel} }

type hubWaker struct {
	h       *Hub
	channel string
}

func (w hubWaker) Listen(ctx context.Context, wake, listening func(), logErr func(error)) {
	s := &hubSub{wake: wake, listening: listening, logErr: logErr}
	if !w.h.add(w.channel, s) {
		logErr(ErrHubClosed)
		<-ctx.Done()
		return
	}
	<-ctx.Done()
	w.h.remove(w.channel, s)
}

func (h *Hub) add(channel string, s *hubSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if h.subs[channel] == nil {
		h.subs[channel] = map[*hubSub]struct{}{}
	}
	h.subs[channel][s] = struct{}{}
	h.signal()
	return true
}

func (h *Hub) remove(channel string, s *hubSub) {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[channel], s)
	if len(h.subs[channel]) == 0 {
		delete(h.subs, channel)
	}
	h.signal()
}

// signal tells the hub's goroutine that the relays listening changed; h.mu is held.
func (h *Hub) signal() {
	select {
	case h.changed <- struct{}{}:
	default: // a change is already pending: the goroutine reads the whole set
	}
}

// each runs fn on every relay of channel ("": every relay) as the set is now.
func (h *Hub) each(channel string, fn func(*hubSub)) {
	h.mu.Lock()
	var subs []*hubSub
	for ch, set := range h.subs {
		if channel == "" || ch == channel {
			for s := range set {
				subs = append(subs, s)
			}
		}
	}
	h.mu.Unlock()
	for _, s := range subs {
		fn(s)
	}
}

func (h *Hub) channels() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]bool, len(h.subs))
	for ch := range h.subs {
		out[ch] = true
	}
	return out
}

func (h *Hub) run(ctx context.Context) {
	defer close(h.done)
	for {
		// Hold no connection while no relay listens.
		for len(h.channels()) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-h.changed:
			}
		}
		err := h.connectAndServe(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			continue // the last relay stopped listening
		}
		h.each("", func(s *hubSub) { s.call(func() { s.logErr(err) }) })
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.retry):
		}
	}
}

// connectAndServe holds one connection until it fails (the error) or no relay listens (nil).
func (h *Hub) connectAndServe(ctx context.Context) error {
	conn, err := h.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// A new connection: every relay is told again that it listens, once its channel is listened to.
	h.each("", func(s *hubSub) { s.told = false })
	listened := map[string]bool{}
	for {
		want := h.channels()
		if len(want) == 0 {
			return nil
		}
		for ch := range want {
			if !listened[ch] {
				if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
					return err
				}
				listened[ch] = true
			}
		}
		for ch := range listened {
			if !want[ch] {
				if _, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
					return err
				}
				delete(listened, ch)
			}
		}
		for ch := range listened {
			h.each(ch, func(s *hubSub) {
				if !s.told {
					s.told = true
					s.call(func() { s.listening(); s.wake() })
				}
			})
		}
		if err := h.wait(ctx, conn); err != nil {
			return err
		}
	}
}

// wait hands notifications to their relays until the relays listening change (nil) or the
// connection fails.
func (h *Hub) wait(ctx context.Context, conn *pgx.Conn) error {
	wctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-h.changed:
			cancel()
		case <-wctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-stopped
	}()
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil && !conn.IsClosed() {
				return nil // interrupted to LISTEN or UNLISTEN: the connection is intact
			}
			return err
		}
		h.each(n.Channel, func(s *hubSub) { s.call(s.wake) })
	}
}
