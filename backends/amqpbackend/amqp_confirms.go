package amqpbackend

import (
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
)

// sharedChannel is a confirm-mode channel that many publishes use at once.
type sharedChannel struct {
	ch      *amqp.Channel
	gen     uint64
	returns chan amqp.Return
	closes  chan *amqp.Error

	mu       sync.Mutex
	returned map[string]amqp.Return                // by message id, until its publisher looks
	inflight map[uint64]*amqp.DeferredConfirmation // by delivery tag
	closeErr *amqp.Error
}

func (sc *sharedChannel) track(dc *amqp.DeferredConfirmation) {
	sc.mu.Lock()
	sc.inflight[dc.DeliveryTag] = dc
	sc.mu.Unlock()
}

func (sc *sharedChannel) untrack(dcs []*amqp.DeferredConfirmation) {
	sc.mu.Lock()
	for _, dc := range dcs {
		delete(sc.inflight, dc.DeliveryTag)
	}
	sc.mu.Unlock()
}

// drain moves what the channel reported into sc; the caller holds sc.mu. Returns and the close
// reason arrive on buffered channels that every waiting publisher drains, so the connection's
// reader never blocks on them.
func (sc *sharedChannel) drain() {
	for {
		select {
		case r, ok := <-sc.returns:
			if !ok {
				sc.returns = nil // closed with the channel; a nil channel is never ready
				continue
			}
			sc.returned[r.MessageId] = r
		case e, ok := <-sc.closes:
			if ok && e != nil && sc.closeErr == nil {
				sc.closeErr = e
			}
			if !ok {
				sc.closes = nil
			}
		default:
			return
		}
	}
}

func (sc *sharedChannel) takeReturn(id string) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.drain()
	_, ok := sc.returned[id]
	delete(sc.returned, id)
	return ok
}

// markAccessDenied marks a refusal of the credentials (403 ACCESS_REFUSED, which the broker also
// sends for a wrong password) or of the virtual host (530 NOT_ALLOWED) as outboxkit.AccessDenied:
// not an outage, which retrying would wait out.
func markAccessDenied(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed) {
		return outboxkit.AccessDenied(err)
	}
	return err
}

// failure classifies a failed publish on sc. A channel closed by a soft exception (406 precondition
// failed, 404 not found, 403 access refused…) refused one message, but the broker does not say
// which, and every message in flight on the channel is nacked with it. So the message is blamed
// (a message error, its attempt counted) only when it was the one unconfirmed message on the
// channel; in a crowd every message gets an unreachable error and no attempt is counted. The
// forwarder then probes with a single message, which names the culprit when its turn comes.
// Anything else means the broker was not reachable.
func (sc *sharedChannel) failure(tag uint64, err error) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.drain()
	e := sc.closeErr
	if e == nil {
		return outboxkit.Unreachable(err)
	}
	if e.Code == amqp.AccessRefused || e.Code == amqp.NotAllowed {
		return outboxkit.AccessDenied(fmt.Errorf("%w: broker closed the channel: %s (%d)", err, e.Reason, e.Code))
	}
	if e.Recover && tag != 0 && sc.aloneUnconfirmed(tag) {
		return fmt.Errorf("%w: broker closed the channel: %s (%d)", err, e.Reason, e.Code)
	}
	return outboxkit.Unreachable(fmt.Errorf("%w: channel closed: %s (%d)", err, e.Reason, e.Code))
}

// aloneUnconfirmed reports whether every other message in flight on sc was confirmed. The broker
// sends a channel's confirms before its close, so they are known by the time the close nacks the
// rest. The caller holds sc.mu.
func (sc *sharedChannel) aloneUnconfirmed(tag uint64) bool {
	for t, dc := range sc.inflight {
		if t != tag && !dc.Acked() {
			return false
		}
	}
	return true
}
