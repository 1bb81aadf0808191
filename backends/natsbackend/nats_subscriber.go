package natsbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// natsSubscriber reads a topic's stream through the consumer group's durable consumer, reading
// from the start with explicit acks; subscribers of one group share it.
//
// It fetches batches of at most batch messages and asks for the next batch only once the last
// one is handed out, and hands out up to unacked before the first is acknowledged (one at a time
// by default; a batching consumer sets it to its batch size), so a handler that blocks never makes
// the client shed what it was handed (the
// "slow consumer" drops of a pull iterator whose buffer fills while the handler waits, which the
// broker redelivers only after AckWait). Every message handed over but not yet acknowledged —
// in the handler or waiting behind it in the batch — is kept alive with an in-progress ack every
// AckWait/3, so AckWait can be short: a message stranded by a lost connection or a dead consumer
// comes back after AckWait, while one held by a slow handler (or by middleware.Circuit during an
// outage) is never redelivered behind its back. A lost connection ends the batch at once: the next
// fetch goes out as soon as the client has reconnected.
//
// It replaces watermill-nats's JetStream subscriber, whose message handler can send on the output
// channel after its monitor closed it when a subscription's context ends ("send on closed
// channel", a panic that takes the consumer down at shutdown), and which leaves the message in
// flight unacknowledged until AckWait. Here the goroutine that sends is the one that closes the
// channel, and a message in flight when the subscription ends is nak'ed for prompt redelivery.
// Messages are read with watermill-nats's unmarshaler: the wire format is its publisher's.
type natsSubscriber struct {
	conn         *nats.Conn
	js           jetstream.JetStream
	group        string
	streamConfig func(string) jetstream.StreamConfig
	ackWait      time.Duration
	batch        int
	unacked      int
	logger       watermill.LoggerAdapter
	life         brokerio.Lifetime
}

// natsSubscribeTimeout bounds the requests that make a subscription's stream and consumer.
const natsSubscribeTimeout = 10 * time.Second

// natsFetchWait bounds one fetch: an idle consumer asks again this often.
const natsFetchWait = 30 * time.Second

func (s *natsSubscriber) consumer(ctx context.Context, topic string) (jetstream.Consumer, error) {
	cfg := s.streamConfig(topic)
	stream, err := s.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		// Subscribers starting together race to create the stream; the loser uses the winner's.
		if existing, serr := s.js.Stream(ctx, cfg.Name); serr == nil {
			stream, err = existing, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream for %s: %w", topic, err)
	}
	name := natsStream("outboxkit_" + s.group)
	consumer, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Name: name, Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, AckWait: s.ackWait,
		MaxAckPending: max(1000, 4*s.batch),
	})
	if err != nil {
		if existing, cerr := stream.Consumer(ctx, name); cerr == nil {
			consumer, err = existing, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", name, topic, err)
	}
	return consumer, nil
}

// SubscribeInitialize creates the topic's stream and the group's durable consumer, which keeps
// every message published from then on for the group.
func (s *natsSubscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.consumer(ctx, topic)
	return err
}

func (s *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	// Admitted first: Close waits for a subscription being made, and then for its two goroutines.
	if !s.life.Enter(2) {
		return nil, errors.New("nats subscriber is closed")
	}
	fail := func(err error) (<-chan *message.Message, error) {
		s.life.Leave()
		s.life.Leave()
		return nil, err
	}
	if !s.conn.IsConnected() {
		// The JetStream requests below would wait for the reconnect until ctx ends (a router's
		// never does): say the server is unreachable now, and the retrying subscriber hands out a
		// channel at once and subscribes in the background.
		return fail(outboxkit.Unreachable(fmt.Errorf("subscribe to %s: not connected to NATS (%v): %w", topic, s.conn.Status(), nats.ErrDisconnected)))
	}
	cctx, cancel := context.WithTimeout(ctx, natsSubscribeTimeout)
	consumer, err := s.consumer(cctx, topic)
	cancel()
	if err != nil {
		return fail(classifyNATS(err))
	}
	out := make(chan *message.Message)
	sctx, stop := context.WithCancel(ctx)
	held := &natsHeld{msgs: map[jetstream.Msg]struct{}{}}
	reconnected := s.conn.StatusChanged(nats.CONNECTED)
	go func() { // ends the subscription with the subscriber; keeps held messages alive
		defer s.life.Leave()
		defer s.conn.RemoveStatusListener(reconnected)
		tick := time.NewTicker(max(s.ackWait/3, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-s.life.Closing():
				stop()
				return
			case <-reconnected:
				held.interruptFetch()
			case <-tick.C:
				held.inProgress()
			}
		}
	}()
	go func() {
		defer s.life.Leave()
		defer close(out)
		var settling sync.WaitGroup
		defer settling.Wait()
		defer stop()
		window := make(chan struct{}, s.unacked) // a slot per message handed out and not settled
		settled := make(chan struct{}, 1)        // a message was settled
		fields := watermill.LogFields{"topic": topic, "consumer_group": s.group}
		for attempt := 1; sctx.Err() == nil; {
			err := s.fetchAndDeliver(sctx, consumer, held, out, window, settled, &settling)
			switch {
			case sctx.Err() != nil:
				return
			case err != nil:
				wait := natsRetry.Delay(attempt)
				attempt++
				s.logger.Error("Cannot fetch from JetStream, retrying", err, fields.Add(watermill.LogFields{"retry_in": wait}))
				select {
				case <-sctx.Done():
				case <-time.After(wait):
				}
			default:
				attempt = 1
			}
		}
	}()
	return out, nil
}

// natsRetry paces fetches after a failed one (the server unreachable, the consumer being moved).
var natsRetry = outboxkit.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// fetchAndDeliver fetches one batch and hands its messages over one by one as they arrive.
// With unacked > 1 it does not wait for the verdicts: window holds a slot per message handed out
// and not settled, across fetches, and settling counts the goroutines that wait for them.
func (s *natsSubscriber) fetchAndDeliver(ctx context.Context, consumer jetstream.Consumer, held *natsHeld, out chan<- *message.Message,
	window, settled chan struct{}, settling *sync.WaitGroup) error {
	fctx, cancel := context.WithTimeout(ctx, natsFetchWait)
	defer cancel()
	held.setFetch(cancel)
	batch, err := consumer.Fetch(s.batch, jetstream.FetchContext(fctx))
	if err != nil {
		return err
	}
	// Read the batch as it arrives, so that what waits behind the handler is known and kept alive.
	queue := make(chan jetstream.Msg, s.batch)
	go func() {
		defer close(queue)
		for jm := range batch.Messages() {
			held.add(jm)
			queue <- jm
		}
	}()
	for jm := range queue {
		if ctx.Err() != nil {
			held.remove(jm)
			_ = jm.Nak() // the subscription ended: back to the group at once
			continue
		}
		if s.unacked == 1 {
			if !s.deliver(ctx, jm, out) {
				_ = jm.Nak() // never handed over, or the subscription ended: back to the group at once
			}
			held.remove(jm)
			continue
		}
		if len(window) == cap(window) {
			// The window is full: hand out again once half of it is settled, in a run, so that a
			// batching consumer finds a batch waiting rather than one message at a time.
			for len(window) > cap(window)/2 && ctx.Err() == nil {
				select {
				case <-settled:
				case <-ctx.Done():
				}
			}
		}
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			held.remove(jm)
			_ = jm.Nak()
			continue
		}
		msg, cancel, ok := s.handOut(ctx, jm, out)
		if !ok {
			held.remove(jm)
			_ = jm.Nak() // the subscription ended: back to the group at once
			<-window
			continue
		}
		settling.Add(1)
		go func() {
			defer settling.Done()
			defer func() {
				<-window
				select {
				case settled <- struct{}{}:
				default:
				}
			}()
			defer held.remove(jm)
			if !s.settle(ctx, jm, msg, cancel) {
				_ = jm.Nak()
			}
		}()
	}
	if err := batch.Error(); err != nil && fctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
		return err
	}
	return nil
}

// deliver hands one message to the consumer and settles it; false when the subscription ended
// before it was settled.
func (s *natsSubscriber) deliver(ctx context.Context, jm jetstream.Msg, out chan<- *message.Message) bool {
	msg, cancel, ok := s.handOut(ctx, jm, out)
	if !ok {
		return false
	}
	return s.settle(ctx, jm, msg, cancel)
}

// handOut reads one message and hands it to the consumer, with what ends the message's context;
// false when the subscription ended first. A message that cannot be read is handed out as it came
// (brokerio.Undecodable), for the consumer to dead-letter.
func (s *natsSubscriber) handOut(ctx context.Context, jm jetstream.Msg, out chan<- *message.Message) (
	msg *message.Message, cancel context.CancelFunc, ok bool) {
	meta, merr := jm.Metadata()
	msg, err := wjs.DefaultUnmarshaler{}.Unmarshal(jm)
	if err != nil {
		// It can never be read: handed out as it came, for the consumer to dead-letter.
		where := "a JetStream message on " + jm.Subject()
		if merr == nil {
			where = fmt.Sprintf("JetStream message %s sequence %d", meta.Stream, meta.Sequence.Stream)
		}
		logs.Warn(s.logger, "Cannot read a JetStream message, handing it out to be dead-lettered", err, watermill.LogFields{"message": where})
		headers := map[string]string{}
		for k, v := range jm.Headers() {
			headers[k] = strings.Join(v, ", ")
		}
		msg = brokerio.Undecodable(where, err, jm.Data(), headers, wmnats.WatermillUUIDHdr)
	} else {
		// A message another producer wrote: its CloudEvents id, or its JetStream message id.
		brokerio.AdoptForeign(msg, brokerio.MetadataAttrs(msg.Metadata, brokerio.CEPrefixNATS, brokerio.CEContentType))
		if msg.UUID == "" {
			msg.UUID = jm.Headers().Get(nats.MsgIdHdr)
		}
	}
	// Ended once the message is settled (see settle), as Watermill's subscribers do.
	msgCtx, cancel := context.WithCancel(ctx)
	if merr == nil {
		// JetStream counts deliveries per consumer: 1 vouches for a first delivery to this group.
		msgCtx = outboxkit.WithRedelivered(msgCtx, meta.NumDelivered > 1)
	}
	msg.SetContext(msgCtx)
	select {
	case out <- msg:
		return msg, cancel, true
	case <-ctx.Done():
		cancel()
		return msg, nil, false
	}
}

// settle waits for the consumer's verdict on msg and sends it to JetStream; false when the
// subscription ended first.
func (s *natsSubscriber) settle(ctx context.Context, jm jetstream.Msg, msg *message.Message, cancel context.CancelFunc) bool {
	defer cancel()
	select {
	case <-msg.Acked():
		if err := jm.DoubleAck(context.WithoutCancel(ctx)); err != nil {
			s.logger.Error("Cannot ack a JetStream message", err, watermill.LogFields{"message_uuid": msg.UUID})
		}
		return true
	case <-msg.Nacked():
		_ = jm.NakWithDelay(500 * time.Millisecond)
		return true
	case <-ctx.Done():
		return false
	}
}

// Unacked is how many messages a subscription hands out before the first is acknowledged.
func (s *natsSubscriber) Unacked() int { return s.unacked }

// natsHeld tracks the messages a subscription was handed and has not settled, and the fetch in
// progress.
type natsHeld struct {
	mu    sync.Mutex
	msgs  map[jetstream.Msg]struct{}
	fetch context.CancelFunc
}

func (h *natsHeld) add(m jetstream.Msg)    { h.mu.Lock(); h.msgs[m] = struct{}{}; h.mu.Unlock() }
func (h *natsHeld) remove(m jetstream.Msg) { h.mu.Lock(); delete(h.msgs, m); h.mu.Unlock() }

func (h *natsHeld) setFetch(cancel context.CancelFunc) { h.mu.Lock(); h.fetch = cancel; h.mu.Unlock() }

// interruptFetch ends the fetch in progress: after a reconnect the server no longer knows it.
func (h *natsHeld) interruptFetch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fetch != nil {
		h.fetch()
	}
}

// inProgress resets the ack timer of every held message.
func (h *natsHeld) inProgress() {
	h.mu.Lock()
	msgs := make([]jetstream.Msg, 0, len(h.msgs))
	for m := range h.msgs {
		msgs = append(msgs, m)
	}
	h.mu.Unlock()
	for _, m := range msgs {
		_ = m.InProgress()
	}
}

// Close ends every subscription, waits for them, and closes the connection.
func (s *natsSubscriber) Close() error {
	return s.life.Close(func() error { s.conn.Close(); return nil })
}
