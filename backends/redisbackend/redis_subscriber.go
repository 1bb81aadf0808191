package redisbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// Liveness of a subscription. Each subscription reads as a Redis consumer of its own, whose name
// ends in heartbeatSuffix, and keeps a key with a short time to live while it runs: a consumer of
// that kind without its key is gone (killed, or its subscription ended), and a live member of the
// group claims its pending entries at once instead of after ClaimAfter. A consumer that does not
// heartbeat (another client, or an older build) keeps the ClaimAfter rule.
const (
	// redisHeartbeat is how often a subscription renews its liveness key.
	redisHeartbeat = time.Second
	// redisAliveFor is the key's time to live: three missed renewals and the consumer is gone.
	redisAliveFor = 3 * redisHeartbeat
	// redisClaimEvery is how often a subscription looks for entries to take over.
	redisClaimEvery = redisHeartbeat
	// redisGoneIdle is the smallest idle time of a gone consumer's entry that is claimed: it keeps
	// two members that take over at the same moment from both claiming it.
	redisGoneIdle = 500 * time.Millisecond
	// redisForgetAfter is how long a consumer with nothing pending may stay silent before the group
	// forgets it.
	redisForgetAfter = 10 * time.Minute
	// redisReadBlock bounds one blocking read: an idle subscription asks again this often.
	redisReadBlock = 250 * time.Millisecond
	// redisNackDelay is how long a nacked entry waits before it is handed out again.
	redisNackDelay = 100 * time.Millisecond
	// redisOwnIdle is the smallest idle time of an entry pending under a subscription's own
	// consumer, and not held by it, that the subscription takes back (see takeBack): longer than a
	// reply takes from Redis to the subscription, so that an entry on its way is not taken for lost.
	// Were it taken anyway, it would still be handed out once: both ways in go through held.
	redisOwnIdle    = time.Second
	heartbeatSuffix = ".hb"
)

// aliveKey names the liveness key of a consumer of group.
func aliveKey(group, consumer string) string { return "outboxkit:alive:" + group + ":" + consumer }

// redisSubscriber reads a topic's stream through the consumer group, as watermill-redisstream's
// subscriber does and in its format, and replaces it for three things it cannot do:
//
//   - It says which deliveries are first ones (outboxkit.WithRedelivered): an entry read with
//     XREADGROUP ">" has never been delivered to the group; an entry claimed from another consumer,
//     or nacked and handed out again, has. middleware.DeliveryCount then writes nothing for a first
//     delivery that succeeds.
//   - A killed consumer's pending entries are taken over within seconds (see aliveKey), while a
//     consumer that is alive, however slow, is never robbed. A live consumer's pending entries
//     that its subscription does not hold (their reply lost, their acknowledgement given up) are
//     handed out again by the subscription itself, within seconds (see takeBack).
//   - It hands out up to unacked entries before the first is acknowledged, read in batches
//     (XREADGROUP COUNT), so that a batching consumer (middleware.BatchConsumer) fills its batches;
//     acknowledgements go out in batches too (XACK of many ids).
type redisSubscriber struct {
	client     *redis.Client        // creates groups
	newClient  func() *redis.Client // a client for each subscription
	group      string
	unacked    int
	claimAfter time.Duration
	marshaller redisMarshaller
	logger     watermill.LoggerAdapter
	life       brokerio.Lifetime
}

func newRedisSubscriber(newClient func() *redis.Client, group string, unacked int, claimAfter time.Duration, m redisMarshaller,
	logger watermill.LoggerAdapter) *redisSubscriber {
	return &redisSubscriber{client: newClient(), newClient: newClient, group: group, unacked: max(unacked, 1), claimAfter: claimAfter, marshaller: m,
		logger: logger}
}

// SubscribeInitialize creates the group on the topic's stream (the stream too, if need be),
// reading from its start.
func (s *redisSubscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.createGroup(ctx, topic)
}

func (s *redisSubscriber) createGroup(ctx context.Context, topic string) error {
	err := s.client.XGroupCreateMkStream(ctx, topic, s.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return classifyRedis(fmt.Errorf("create consumer group %s on %s: %w", s.group, topic, err))
	}
	return nil
}

// Unacked is how many entries a subscription hands out before the first is acknowledged.
func (s *redisSubscriber) Unacked() int { return s.unacked }

// Subscribe creates the group if need be and starts reading before it returns. The channel closes
// when ctx ends or the subscriber is closed; entries handed out and not acknowledged by then stay
// pending and are taken over by a live member of the group within seconds.
func (s *redisSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if !s.life.Enter(1) {
		return nil, errors.New("redis subscriber is closed")
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := s.createGroup(cctx, topic)
	cancel()
	if err != nil {
		s.life.Leave()
		return nil, err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	// Each subscription has a client, and so a bounded pool, of its own: it holds a connection in
	// its blocking read and uses up to three more (liveness, claims, acks), so subscriptions sharing
	// one bounded pool would starve each other's liveness key and be taken for gone.
	sub := &redisSubscription{
		s: s, client: s.newClient(), topic: topic, consumer: s.group + "-" + hex.EncodeToString(id[:]) + heartbeatSuffix,
		out: make(chan *message.Message, s.unacked), window: make(chan struct{}, s.unacked),
		claimed: make(chan []redis.XMessage, 1), acks: make(chan string, s.unacked),
		fields: watermill.LogFields{"topic": topic, "consumer_group": s.group},
	}
	sctx, stop := context.WithCancel(ctx)
	// The key exists before the consumer does: nobody may take it for a gone one.
	if err := sub.heartbeat(sctx); err != nil {
		stop()
		_ = sub.client.Close()
		s.life.Leave()
		return nil, classifyRedis(fmt.Errorf("subscribe to %s: %w", topic, err))
	}
	go func() {
		defer s.life.Leave()
		defer stop()
		sub.run(sctx, stop)
	}()
	return sub.out, nil
}

// Close ends every subscription, waits for them and closes the client.
func (s *redisSubscriber) Close() error { return s.life.Close(s.client.Close) }

// redisSubscription is one Subscribe: a consumer of the group of its own.
type redisSubscription struct {
	s        *redisSubscriber
	client   *redis.Client
	topic    string
	consumer string
	out      chan *message.Message
	window   chan struct{}         // a slot per entry handed out and not settled
	claimed  chan []redis.XMessage // entries the claimer took over, to hand out before new ones
	acks     chan string           // ids to acknowledge
	settling sync.WaitGroup        // goroutines waiting for a verdict
	// held has the ids of the entries this subscription holds: queued to be handed out, handed
	// out and not settled, or acknowledged and their XACK not done yet. What is pending under the
	// consumer and not here has been lost on the way and is taken back (takeBack); an entry is
	// admitted here once (hold), so however it comes, a second time it is not handed out.
	held   sync.Map
	fields watermill.LogFields
}

func (r *redisSubscription) run(ctx context.Context, stop context.CancelFunc) {
	var loops sync.WaitGroup
	loops.Add(3)
	go func() { // ends the subscription with the subscriber; keeps the consumer alive
		defer loops.Done()
		tick := time.NewTicker(redisHeartbeat)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.s.life.Closing():
				stop()
				return
			case <-tick.C:
				if err := r.heartbeat(ctx); err != nil && ctx.Err() == nil {
					r.s.logger.Error("Cannot renew the consumer's liveness key", err, r.fields)
				}
			}
		}
	}()
	go func() { defer loops.Done(); r.claimLoop(ctx) }()
	acked := make(chan struct{})
	go func() { defer loops.Done(); defer close(acked); r.ackLoop() }()
	r.readLoop(ctx)
	r.settling.Wait() // every verdict given, or the subscription ended first
	close(r.acks)
	<-acked
	loops.Wait()
	close(r.out)
	// Gone: what is still pending goes to a live member at once.
	end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r.client.Del(end, aliveKey(r.s.group, r.consumer))
	if p, err := r.client.XPendingExt(end, &redis.XPendingExtArgs{Stream: r.topic, Group: r.s.group, Start: "-", End: "+",
		Count: 1, Consumer: r.consumer}).Result(); err == nil && len(p) == 0 {
		r.client.XGroupDelConsumer(end, r.topic, r.s.group, r.consumer)
	}
	_ = r.client.Close()
}

func (r *redisSubscription) heartbeat(ctx context.Context) error {
	return r.client.Set(ctx, aliveKey(r.s.group, r.consumer), "1", redisAliveFor).Err()
}

// readLoop reads new entries, as many as the window has room for, and hands them out; entries the
// claimer took over or took back go first.
func (r *redisSubscription) readLoop(ctx context.Context) {
	for attempt := 1; ; {
		if !r.acquire(ctx) {
			return
		}
		free := 1
	more:
		for free < r.s.unacked {
			select {
			case r.window <- struct{}{}:
				free++
			default:
				break more
			}
		}
		// Read runs, not single entries: while half the window is taken, wait for it to drain (a
		// batch being committed frees all its slots at once).
		for free < (r.s.unacked+1)/2 {
			select {
			case r.window <- struct{}{}:
				free++
			case <-ctx.Done():
				r.release(free)
				return
			}
		}
		select {
		case xms := <-r.claimed:
			free = r.handOut(ctx, xms, true, free)
			r.release(free)
			continue
		default:
		}
		xss, err := r.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: r.s.group, Consumer: r.consumer,
			Streams: []string{r.topic, ">"}, Count: int64(free), Block: redisReadBlock}).Result()
		if ctx.Err() != nil {
			r.release(free)
			return
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			// What a reply that never arrived held is pending under this consumer: takeBack hands
			// it out. (A reply cut mid-way is most often not seen here at all: go-redis reads again
			// on a new connection and returns what that read found.)
			r.release(free)
			if strings.HasPrefix(err.Error(), "NOGROUP") { // the stream or group was deleted: make them again
				_ = r.s.createGroup(ctx, r.topic)
			}
			wait := redisRetry.Delay(attempt)
			attempt++
			r.s.logger.Error("Cannot read from the Redis stream, retrying", err, r.fields.Add(watermill.LogFields{"retry_in": wait}))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		attempt = 1
		for _, xs := range xss {
			free = r.handOut(ctx, r.hold(xs.Messages), false, free)
		}
		r.release(free)
	}
}

// redisRetry paces reads after a failed one.
var redisRetry = outboxkit.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// acquire takes a slot in the window, waiting for one; false when the subscription ended.
func (r *redisSubscription) acquire(ctx context.Context) bool {
	select {
	case r.window <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *redisSubscription) release(n int) {
	for ; n > 0; n-- {
		<-r.window
	}
}

// hold admits into held the entries not held yet and returns them: those to hand out.
func (r *redisSubscription) hold(xms []redis.XMessage) []redis.XMessage {
	fresh := make([]redis.XMessage, 0, len(xms))
	for _, xm := range xms {
		if _, already := r.held.LoadOrStore(xm.ID, struct{}{}); !already {
			fresh = append(fresh, xm)
		}
	}
	return fresh
}

// handOut hands entries over in order, each with one of the free slots (entries beyond them wait
// for slots); it returns the slots left unused. The entries are held (hold); those it cannot hand
// out, the subscription having ended, it lets go.
func (r *redisSubscription) handOut(ctx context.Context, xms []redis.XMessage, redelivered bool, free int) int {
	for i, xm := range xms {
		if free == 0 {
			if !r.acquire(ctx) {
				r.letGo(xms[i:])
				return 0
			}
			free = 1
		}
		msg, err := r.s.marshaller.Unmarshal(xm.Values)
		if err != nil {
			// It can never be read: handed out as it came, for the consumer to dead-letter.
			logs.Warn(r.s.logger, "Cannot read a Redis stream entry, handing it out to be dead-lettered", err,
				r.fields.Add(watermill.LogFields{"xid": xm.ID}))
			msg = undecodableEntry(r.topic, xm, err)
		}
		free--
		r.settling.Add(1)
		cancel, ok := r.send(ctx, msg, redelivered)
		if !ok {
			r.settling.Done()
			r.release(1)
			r.letGo(xms[i:])
			return free
		}
		go r.settle(ctx, xm.ID, msg, cancel)
	}
	return free
}

func (r *redisSubscription) letGo(xms []redis.XMessage) {
	for _, xm := range xms {
		r.held.Delete(xm.ID)
	}
}

// send hands msg out, with what ends its context once it is settled (as Watermill's subscribers
// do); false when the subscription ended first.
func (r *redisSubscription) send(ctx context.Context, msg *message.Message, redelivered bool) (context.CancelFunc, bool) {
	mctx, cancel := context.WithCancel(ctx)
	msg.SetContext(outboxkit.WithConsumer(outboxkit.WithRedelivered(mctx, redelivered), r.s.group))
	select {
	case r.out <- msg:
		return cancel, true
	case <-ctx.Done():
		cancel()
		return nil, false
	}
}

// settle waits for the verdict on msg, handed out: an ack queues its XACK (the entry stays held
// until it is done); a nack hands it out again after redisNackDelay. Its slot is freed once it is
// acknowledged, or when the subscription ends first (the entry stays pending and is taken over).
func (r *redisSubscription) settle(ctx context.Context, id string, msg *message.Message, cancel context.CancelFunc) {
	defer r.settling.Done()
	acked := false
	defer func() {
		if !acked {
			r.held.Delete(id)
		}
	}()
	defer func() { <-r.window }()
	defer func() { cancel() }()
	for {
		select {
		case <-msg.Acked():
			cancel()
			acked = true
			r.acks <- id
			return
		case <-msg.Nacked():
			cancel()
			msg = msg.Copy()
			select {
			case <-time.After(redisNackDelay):
			case <-ctx.Done():
				return
			}
			var ok bool
			if cancel, ok = r.send(ctx, msg, true); !ok {
				cancel = func() {}
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// ackLoop acknowledges what is queued, many ids per XACK, until acks closes.
func (r *redisSubscription) ackLoop() {
	ids := make([]string, 0, r.s.unacked)
	for id := range r.acks {
		ids = append(ids[:0], id)
	drain:
		for len(ids) < 1000 {
			select {
			case id, ok := <-r.acks:
				if !ok {
					break drain
				}
				ids = append(ids, id)
			default:
				break drain
			}
		}
		r.ack(ids)
		for _, id := range ids {
			r.held.Delete(id)
		}
	}
}

// ack acknowledges ids, trying again for a while when Redis does not answer; an entry left
// unacknowledged is handed out again (a duplicate the inbox absorbs): by this subscription once no
// longer held (takeBack), or by the member that takes it over once this one is gone.
func (r *redisSubscription) ack(ids []string) {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.client.XAck(ctx, r.topic, r.s.group, ids...).Err()
		cancel()
		if err == nil {
			return
		}
		if attempt == 5 {
			r.s.logger.Error("Cannot acknowledge Redis stream entries, they will be handed out again", err,
				r.fields.Add(watermill.LogFields{"entries": len(ids)}))
			return
		}
		time.Sleep(redisRetry.Delay(attempt))
	}
}

// undecodableEntry is the message handed out for an entry that cannot be read: its payload field
// as the payload, its other fields as metadata.
func undecodableEntry(topic string, xm redis.XMessage, err error) *message.Message {
	var payload []byte
	fields := make(map[string]string, len(xm.Values))
	for k, v := range xm.Values {
		s := fmt.Sprint(v)
		if k == "payload" {
			payload = []byte(s)
			continue
		}
		fields[k] = s
	}
	return brokerio.Undecodable(fmt.Sprintf("Redis stream entry %s of %s", xm.ID, topic), err, payload, fields, redisstream.UUIDHeaderKey)
}
