package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// horizonPrefix starts the metadata a member commits with a partition's offset: the first offset
// no member of the group has been handed yet. A member commits a larger horizon before it hands out
// a record at or past the committed one, so that whoever reads the partition next knows which
// records may have been delivered before (below the horizon) and which are first deliveries.
const horizonPrefix = "outboxkit:horizon="

// horizonAhead is the farthest a member keeps the horizon past what it has handed out (or twice
// unacked, if more). It keeps it about twice what the partition hands out in kafkaHorizonEvery
// ahead, at least kafkaAheadMin, so that a commit covers many records. A member that ends its claim
// in order commits the horizon of what it did hand out; after a crash, the records between what was
// handed out and the horizon, which no one was handed, are taken for redeliveries (counted once
// more than they were delivered): a few seconds of the partition's records, not horizonAhead.
const horizonAhead = 256

// kafkaAheadMin is the least a member keeps the horizon past what it has handed out.
const kafkaAheadMin = 16

// kafkaHorizonEvery is how often a member moves the horizon to follow the partition's rate.
const kafkaHorizonEvery = time.Second

// kafkaNackDelay is how long a nacked record waits before it is handed out again.
const kafkaNackDelay = 100 * time.Millisecond

// kafkaBalancers assign a group's partitions, the first that every member supports. The
// cooperative sticky balancer moves only the partitions that must move (KIP-429): a member joining
// or leaving the group, or a restarted one coming back, takes partitions from the others without
// stopping them on the partitions they keep. The range balancer (eager) is what members of earlier
// versions, on Sarama, offer: while they are in the group, during a rolling upgrade, the group is
// balanced as before, and it turns cooperative once they are all gone.
var kafkaBalancers = func() []kgo.GroupBalancer {
	return []kgo.GroupBalancer{kgo.CooperativeStickyBalancer(), kgo.RangeBalancer()}
}

// kafkaSubscriber reads a topic through a consumer group with franz-go, in watermill-kafka's
// format, and commits offsets itself. It is a consumer group member that
//
//   - is balanced cooperatively (kafkaBalancers): when the group changes, only the partitions that
//     move are revoked; a member goes on delivering the partitions it keeps.
//   - says which deliveries are first ones (outboxkit.WithRedelivered), from the offsets: a
//     record at or past the horizon committed with the partition's offset (see horizonPrefix) was
//     never handed to a member of the group; one below it may have been (a member read it and died
//     before committing), and so may any record of a partition whose horizon is unknown (committed
//     by another client) that was already there when the partition was assigned. A record handed
//     out again after a nack is a redelivery. middleware.DeliveryCount then writes nothing for a
//     first delivery that succeeds.
//   - hands out up to unacked records of each partition before the first is acknowledged, in
//     offset order, so that a batching consumer (middleware.BatchConsumer) fills its batches; the
//     offset committed is that of the first record not acknowledged, committed as
//     acknowledgements come (kafkaCommits): a process that dies has its successor read again
//     only what it held and what it acknowledged in the last kafkaCommitGap (in its claim's
//     first second) or kafkaCommitBusyGap.
//   - gives a revoked partition up cleanly: its records handed out have a moment to be settled,
//     and what was acknowledged is committed before the group may assign the partition to another
//     member. A partition lost (the member was fenced out of the group) is abandoned at once: its
//     records' contexts end and nothing is committed, as the group has moved on.
type kafkaSubscriber struct {
	conn      kafkaConn
	group     string
	marshaler kafkaMarshaler
	unacked   int
	// instanceID, when set, makes each subscription a static member, named instanceID.topic.
	instanceID string
	logger     watermill.LoggerAdapter
	life       brokerio.Lifetime
}

// Unacked is how many records of a partition a subscription hands out before the first is
// acknowledged.
func (s *kafkaSubscriber) Unacked() int { return s.unacked }

// kafkaClientOpts are what every client of the subscriber is made with.
func (s *kafkaSubscriber) kafkaClientOpts() []kgo.Opt {
	return append(s.conn.kgoOpts(), kgo.RetryBackoffFn(kafkaClientBackoff))
}

// kafkaClientBackoff is how long franz-go waits before trying a failed request again, the group's
// join among them: 250 ms doubling to at most 1 s, jittered ±20%. franz-go's default grows to 5 s,
// so a member that lost its group session in a run of short outages (a flapping network) came back
// up to 5 s after the broker did — 10 of a 16 s stall of a consumer group in the chaos soak
// (TestKafka_MemberRejoinsSoonAfterALongOutage). A request a second costs a broker that is down
// nothing worth saving.
func kafkaClientBackoff(fails int) time.Duration { return kafkaRetryBackoff.Delay(fails) }

var kafkaRetryBackoff = outboxkit.Backoff{Initial: 250 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.2}

// SubscribeInitialize creates the topic with the broker's defaults (partitions, replication) if it
// does not exist: a new group reads it from its oldest offset.
func (s *kafkaSubscriber) SubscribeInitialize(topic string) error {
	cl, err := kgo.NewClient(s.kafkaClientOpts()...)
	if err != nil {
		return fmt.Errorf("kafka subscriber: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 15000
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = topic, -1, -1
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Topics) == 1 {
		if err = kerr.ErrorForCode(resp.Topics[0].ErrorCode); errors.Is(err, kerr.TopicAlreadyExists) {
			err = nil
		}
	}
	if err != nil {
		return classifyKafka(fmt.Errorf("kafka subscriber: create topic %s: %w", topic, err))
	}
	return nil
}

// Subscribe joins the group and returns; records arrive once the group has assigned partitions.
// The channel closes when ctx ends or the subscriber is closed; records handed out and not
// acknowledged by then are read again by the partition's next owner.
func (s *kafkaSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if !s.life.Enter(1) {
		return nil, errors.New("kafka subscriber is closed")
	}
	sctx, stop := context.WithCancel(ctx)
	c := &kafkaConsumer{s: s, ctx: sctx, topic: topic, out: make(chan *message.Message, s.unacked), ready: make(chan struct{}),
		claims: map[int32]*kafkaClaim{}, fields: watermill.LogFields{"topic": topic, "consumer_group": s.group}}
	opts := append(s.kafkaClientOpts(),
		kgo.ConsumerGroup(s.group),
		kgo.ConsumeTopics(topic),
		kgo.Balancers(kafkaBalancers()...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // a new group reads what was published before it joined
		kgo.DisableAutoCommit(),                           // a claim commits what was settled, in order
		kgo.BlockRebalanceOnPoll(),                        // records polled are dispatched before partitions move
		kgo.FetchMaxWait(500*time.Millisecond),            // a partition resumed is fetched again soon
		kgo.SessionTimeout(kafkaSessionTimeout),
		kgo.RebalanceTimeout(kafkaRebalanceTimeout),
		kgo.HeartbeatInterval(kafkaHeartbeat),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, tps map[string][]int32) { c.revoked(tps, false) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, tps map[string][]int32) { c.revoked(tps, true) }),
		kgo.WithLogger(newKgoLogger(s.logger, c.fields)),
		// A connection the broker closes at once is taken by franz-go for a client misconfigured
		// (TLS, SASL) and not tried again: a member whose heartbeat met a broker's restart, or a
		// load balancer in front of it, lost its group session — its partitions abandoned, read
		// again from the last commit after a rebalance — over a blip of a second. kafkaCheck has
		// just proven this configuration with the same brokers, so the member tries again, as for
		// any broken connection, within its session timeout (the heartbeat's retries stop there).
		kgo.AlwaysRetryEOF(),
	)
	if s.instanceID != "" {
		opts = append(opts, kgo.InstanceID(s.instanceID+"."+topic))
	}
	// The cluster is asked first, by a client of its own: the member's client joins the group as
	// soon as it is made.
	err := kafkaCheck(ctx, s.kafkaClientOpts(), topic)
	var cl *kgo.Client
	if err == nil {
		cl, err = kgo.NewClient(opts...)
	}
	if err != nil {
		stop()
		s.life.Leave()
		return nil, classifyKafka(fmt.Errorf("kafka subscriber %s: %w", s.group, s.conn.explain(err)))
	}
	c.cl = cl
	close(c.ready) // the group's callbacks may run from here on
	go func() {
		defer s.life.Leave()
		defer close(c.out)
		defer stop()
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			select {
			case <-sctx.Done():
			case <-s.life.Closing():
				stop()
			}
		}()
		c.poll()
		// Leaving (or, for a static member, only stopping) revokes what is assigned: each claim
		// commits what was acknowledged.
		cl.CloseAllowingRebalance()
		c.revokeAll(false)
		c.settling.Wait()
		<-watched
	}()
	return c.out, nil
}

// kafkaCheck asks the cluster for the topic's metadata: an unreachable cluster or a refused
// client is told at Subscribe, not only in the logs later.
func kafkaCheck(ctx context.Context, opts []kgo.Opt, topic string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false // asking creates nothing: SubscribeInitialize does
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("topic %s: %w", topic, err)
		}
	}
	return nil
}

// kafkaRetry paces the attempts to read a group's offsets when partitions are assigned.
var kafkaRetry = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// Close ends every subscription and waits for them.
func (s *kafkaSubscriber) Close() error { return s.life.Close(nil) }

// kafkaPollMax is how many records one poll takes at most.
const kafkaPollMax = 1000

// kafkaConsumer is a subscription: a group member that polls the topic and hands each partition's
// records to that partition's claim.
type kafkaConsumer struct {
	s        *kafkaSubscriber
	ctx      context.Context // the subscription's
	cl       *kgo.Client
	ready    chan struct{} // closed once cl is set
	topic    string
	out      chan *message.Message
	fields   watermill.LogFields
	settling sync.WaitGroup           // the claims and their goroutines
	topicID  atomic.Pointer[[16]byte] // what OffsetCommit v10 names the topic by

	mu     sync.Mutex
	claims map[int32]*kafkaClaim // the partitions assigned
}

// poll dispatches the records polled to their claims until the subscription ends. Rebalances wait
// while a poll's records are dispatched (BlockRebalanceOnPoll), which never blocks: a claim whose
// queue fills pauses its partition instead.
func (c *kafkaConsumer) poll() {
	for {
		fetches := c.cl.PollRecords(c.ctx, kafkaPollMax)
		if c.ctx.Err() != nil {
			c.cl.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				c.s.logger.Error("Cannot fetch from Kafka", err, c.fields.Add(watermill.LogFields{"partition": p}))
			}
		})
		c.mu.Lock()
		fetches.EachRecord(func(r *kgo.Record) {
			if claim := c.claims[r.Partition]; claim != nil && r.Topic == c.topic {
				claim.push(r)
			}
		})
		c.mu.Unlock()
		c.cl.AllowRebalance()
	}
}

// assigned starts a claim for each partition assigned, after reading the horizons their previous
// owners committed. Fetching begins once it returns.
func (c *kafkaConsumer) assigned(ctx context.Context, _ *kgo.Client, tps map[string][]int32) {
	<-c.ready
	partitions := tps[c.topic]
	if len(partitions) == 0 {
		return
	}
	member, generation := c.cl.GroupMetadata()
	c.s.logger.Info("Kafka partitions assigned", c.fields.Add(watermill.LogFields{
		"generation": generation, "member": member, "partitions": fmt.Sprint(partitions)}))
	if c.topicID.Load() == nil {
		if err := c.readTopicID(ctx); err != nil {
			logs.Warn(c.s.logger, "Cannot read the topic's id; offsets are committed by its name", err, c.fields)
		}
	}
	horizons := c.horizons(ctx, partitions)
	c.cl.ResumeFetchPartitions(map[string][]int32{c.topic: partitions}) // a claim starts with an empty queue
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range partitions {
		if old := c.claims[p]; old != nil { // not expected: a partition is revoked before it is assigned again
			old.end(true)
			<-old.done
		}
		h := horizons[p]
		cctx, cancel := context.WithCancel(c.ctx)
		claim := &kafkaClaim{c: c, p: p, ctx: cctx, cancel: cancel, vouchFrom: h.vouchFrom, handedFrom: h.handedFrom,
			committed: h.committed, wake: make(chan struct{}, 1), done: make(chan struct{}),
			limit: max(2*c.s.unacked, 256), fields: c.fields.Add(watermill.LogFields{"partition": p})}
		c.claims[p] = claim
		c.settling.Add(1)
		go func() {
			defer c.settling.Done()
			defer close(claim.done)
			claim.run()
		}()
	}
}

// revoked ends the claims of the partitions revoked (lost: abandoned) and waits for them: a
// revoked claim commits what was acknowledged before the group may hand its partition to another
// member.
func (c *kafkaConsumer) revoked(tps map[string][]int32, lost bool) {
	<-c.ready
	partitions := tps[c.topic]
	if len(partitions) == 0 {
		return
	}
	c.s.logger.Info("Kafka partitions revoked", c.fields.Add(watermill.LogFields{"partitions": fmt.Sprint(partitions), "lost": lost}))
	var ending []*kafkaClaim
	c.mu.Lock()
	for _, p := range partitions {
		if claim := c.claims[p]; claim != nil {
			delete(c.claims, p)
			claim.end(lost)
			ending = append(ending, claim)
		}
	}
	c.mu.Unlock()
	for _, claim := range ending {
		<-claim.done
	}
	c.cl.ResumeFetchPartitions(map[string][]int32{c.topic: partitions})
}

// revokeAll ends every claim left and waits for them.
func (c *kafkaConsumer) revokeAll(lost bool) {
	c.mu.Lock()
	var partitions []int32
	for p := range c.claims {
		partitions = append(partitions, p)
	}
	c.mu.Unlock()
	c.revoked(map[string][]int32{c.topic: partitions}, lost)
}

// readTopicID reads the topic's id from its metadata.
func (c *kafkaConsumer) readTopicID(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(c.topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == c.topic && t.TopicID != [16]byte{} {
			id := t.TopicID
			c.topicID.Store(&id)
			return nil
		}
	}
	return errors.New("no topic id in the metadata")
}

// kafkaHorizon is what a claim starts from: records below vouchFrom may have been handed out
// before; handedFrom is where its own horizon starts (-1: only past what it hands out); committed
// is the horizon committed (-1: none).
type kafkaHorizon struct{ vouchFrom, handedFrom, committed int64 }

// horizons reads the offsets committed for partitions, with their horizons, retrying for a while.
// When they cannot be read every record of the partition is taken for a redelivery.
func (c *kafkaConsumer) horizons(ctx context.Context, partitions []int32) map[int32]kafkaHorizon {
	deadline := time.Now().Add(kafkaRebalanceTimeout / 2)
	for attempt := 1; ; attempt++ {
		h, err := c.readHorizons(ctx, partitions)
		if err == nil {
			return h
		}
		wait := kafkaRetry.Delay(attempt)
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			logs.Warn(c.s.logger, "Cannot read the group's offsets; the partitions' records count as redeliveries", err, c.fields)
			h := map[int32]kafkaHorizon{}
			for _, p := range partitions {
				h[p] = kafkaHorizon{vouchFrom: math.MaxInt64, handedFrom: -1, committed: -1}
			}
			return h
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (c *kafkaConsumer) readHorizons(ctx context.Context, partitions []int32) (map[int32]kafkaHorizon, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = c.s.group
	t := kmsg.NewOffsetFetchRequestTopic()
	t.Topic, t.Partitions = c.topic, partitions
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	got := map[int32]kmsg.OffsetFetchResponseTopicPartition{}
	for _, t := range resp.Topics {
		if t.Topic == c.topic {
			for _, p := range t.Partitions {
				got[p.Partition] = p
			}
		}
	}
	h := map[int32]kafkaHorizon{}
	var foreign []int32
	for _, p := range partitions {
		block, ok := got[p]
		if !ok {
			return nil, fmt.Errorf("read the committed offset of %s/%d: not in the response", c.topic, p)
		}
		if err := kerr.ErrorForCode(block.ErrorCode); err != nil {
			return nil, fmt.Errorf("read the committed offset of %s/%d: %w", c.topic, p, err)
		}
		if block.Metadata != nil {
			if v, ok := strings.CutPrefix(*block.Metadata, horizonPrefix); ok {
				if horizon, err := strconv.ParseInt(v, 10, 64); err == nil {
					h[p] = kafkaHorizon{vouchFrom: horizon, handedFrom: horizon, committed: horizon}
					continue
				}
			}
		}
		if block.Offset < 0 {
			// nothing committed: nobody handed anything out (a member commits first)
			h[p] = kafkaHorizon{vouchFrom: 0, handedFrom: 0, committed: -1}
			continue
		}
		foreign = append(foreign, p)
	}
	if len(foreign) == 0 {
		return h, nil
	}
	// Committed by another client, which says nothing of what it read: only what arrives from now
	// on was never delivered.
	lreq := kmsg.NewPtrListOffsetsRequest()
	lreq.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = c.topic
	for _, p := range foreign {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp, lp.CurrentLeaderEpoch = p, -1, -1 // the newest
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("read the newest offset of %s/%d: %w", c.topic, p.Partition, err)
			}
			h[p.Partition] = kafkaHorizon{vouchFrom: p.Offset, handedFrom: p.Offset, committed: -1}
		}
	}
	for _, p := range foreign {
		if _, ok := h[p]; !ok {
			return nil, fmt.Errorf("read the newest offset of %s/%d: not in the response", c.topic, p)
		}
	}
	return h, nil
}

// kafkaClaim is a partition assigned to the subscription: it hands the partition's records out,
// up to unacked at a time, and commits the offset of the first one not acknowledged as it moves
// (see kafkaCommits) and when it ends.
type kafkaClaim struct {
	c                                *kafkaConsumer
	p                                int32
	ctx                              context.Context // ends when the claim does
	cancel                           context.CancelFunc
	vouchFrom, handedFrom, committed int64
	limit                            int // the queue's length that pauses the partition
	fields                           watermill.LogFields
	done                             chan struct{}
	lost                             atomic.Bool

	mu     sync.Mutex
	queue  []*kgo.Record
	paused bool
	wake   chan struct{}
}

// push queues a record polled, and pauses the partition when the queue is full. The pause and the
// resume (pop) happen under the claim's lock, in the order of the queue's changes.
func (k *kafkaClaim) push(r *kgo.Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.queue = append(k.queue, r)
	select {
	case k.wake <- struct{}{}:
	default:
	}
	if len(k.queue) >= k.limit && !k.paused {
		k.paused = true
		k.c.cl.PauseFetchPartitions(map[string][]int32{k.c.topic: {k.p}})
	}
}

// pop takes the next record queued, resuming the partition once the queue has half emptied.
func (k *kafkaClaim) pop() *kgo.Record {
	k.mu.Lock()
	if len(k.queue) == 0 {
		k.mu.Unlock()
		return nil
	}
	r := k.queue[0]
	k.queue[0] = nil
	k.queue = k.queue[1:]
	if len(k.queue) > 0 {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
	if k.paused && len(k.queue) <= k.limit/2 {
		k.paused = false
		k.c.cl.ResumeFetchPartitions(map[string][]int32{k.c.topic: {k.p}})
	}
	k.mu.Unlock()
	return r
}

// end makes the claim end: revoked, it commits what was acknowledged; lost, it abandons what it
// handed out and commits nothing.
func (k *kafkaClaim) end(lost bool) {
	if lost {
		k.lost.Store(true)
	}
	k.cancel()
}

// kafkaRecord is a record handed out and not yet settled.
type kafkaRecord struct {
	offset int64
	acked  bool
}

// kafkaVerdict is what the consumer said of a record.
type kafkaVerdict struct {
	offset int64
	msg    *message.Message // set on a nack: the record to hand out again
}

func (k *kafkaClaim) run() {
	c, ctx, p := k.c, k.ctx, k.p
	vouchFrom := k.vouchFrom
	// What is handed out is waited for a little past the claim's end (see below).
	held, release := context.WithCancel(c.ctx)
	defer release()
	next := int64(-1)      // the first offset not acknowledged: known with the first record
	handed := k.handedFrom // past what this member, and any before it, may have handed out
	horizon := k.committed // the horizon last asked for
	// ahead is how far past what is handed out the horizon is kept: twice what the partition hands
	// out in kafkaHorizonEvery, at least kafkaAheadMin; doubled whenever hand-outs catch up with it.
	ahead, aheadMax := int64(kafkaAheadMin), int64(max(horizonAhead, 2*c.s.unacked))
	var (
		out      []*kafkaRecord // handed out, in offset order
		verdicts = make(chan kafkaVerdict, c.s.unacked)
		tick     = time.NewTicker(kafkaHorizonEvery)
		lastTick = handed
		commits  = newKafkaCommits(c, p, -1, k.committed)
	)
	defer tick.Stop()
	// The commits outlive the claim's context: its last one is made once it has ended (below).
	cctx, stopCommits := context.WithCancel(context.WithoutCancel(ctx))
	committing := make(chan struct{})
	go func() {
		defer close(committing)
		commits.run(cctx)
	}()
	defer func() {
		stopCommits()
		<-committing
	}()
	apply := func(v kafkaVerdict) {
		if v.msg != nil { // nacked: handed out again, held still
			c.settling.Add(1)
			go func() {
				select {
				case <-time.After(kafkaNackDelay):
				case <-ctx.Done():
					c.settling.Done()
					return
				}
				cancel, ok := c.send(ctx, held, v.msg, true)
				if !ok {
					c.settling.Done()
					return
				}
				c.settle(held, v.offset, v.msg, cancel, verdicts)
			}()
			return
		}
		for _, r := range out {
			if r.offset == v.offset {
				r.acked = true
			}
		}
		moved := false
		for len(out) > 0 && out[0].acked {
			next = out[0].offset + 1
			out = out[1:]
			moved = true
		}
		if moved {
			commits.ask(kafkaCommitAsk{offset: next, horizon: horizon})
		}
	}
	defer func() {
		if k.lost.Load() {
			return // the group moved on: what is held is abandoned (release), nothing committed
		}
		// The claim ends (revoked, the subscription's end): give what is held a moment to be
		// settled, then commit what was acknowledged, before the partition moves on.
		deadline := time.NewTimer(kafkaRebalanceTimeout / 2)
		defer deadline.Stop()
	wait:
		for len(out) > 0 {
			select {
			case v := <-verdicts:
				if v.msg == nil {
					apply(v)
				}
			case <-deadline.C:
				break wait
			case <-held.Done():
				break wait
			}
		}
		if next < 0 {
			return // nothing handed out
		}
		// The horizon comes back to what was handed out: the partition's next owner takes the
		// records past it for first deliveries.
		commits.hurry()
		n := commits.ask(kafkaCommitAsk{offset: next, horizon: max(handed, next)})
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := commits.wait(wctx, n); err != nil {
			c.s.logger.Info("Cannot commit at the end of a claim; its records will be read again", k.fields.Add(watermill.LogFields{"err": err}))
		}
	}()
	full := false // the window filled up: hand out again once half of it is settled, in a run
	for {
		var wake <-chan struct{}
		if len(out) >= c.s.unacked {
			full = true
		} else if full && len(out) <= c.s.unacked/2 {
			full = false
		}
		if !full {
			wake = k.wake
		}
		select {
		case <-ctx.Done():
			return
		case v := <-verdicts:
			apply(v)
		case <-tick.C:
			// Keep the horizon between half and twice ahead past what is handed out: near enough
			// that a crash leaves few records taken for redeliveries, far enough that handing out
			// seldom waits for a commit.
			rate := handed - lastTick
			lastTick = handed
			if target := max(kafkaAheadMin, 2*rate); target < ahead/2 {
				ahead = target
			}
			if from := max(handed, next); next >= 0 && (horizon-from > 2*ahead || horizon-from < ahead/2) {
				horizon = from + ahead
				commits.ask(kafkaCommitAsk{offset: next, horizon: horizon})
			}
		case <-wake:
			r := k.pop()
			if r == nil {
				continue
			}
			if next < 0 { // the first record: where the group's committed offset, or the oldest, is
				next = r.Offset
				handed = max(handed, next)
			}
			if r.Offset >= commits.horizonFloor() {
				// Past the horizon: have a new one committed before handing this record out.
				if horizon <= r.Offset {
					if horizon >= 0 {
						ahead = min(2*ahead, aheadMax) // caught up with it: a longer stride
					}
					horizon = r.Offset + ahead
				}
				n := commits.ask(kafkaCommitAsk{offset: next, horizon: horizon})
				if err := commits.wait(ctx, n); err != nil || r.Offset >= commits.horizonFloor() {
					if ctx.Err() == nil {
						c.s.logger.Error("Cannot commit the group's read horizon; the claim pauses", err, k.fields)
						k.requeue(r)
						select { // the record is handed out once a commit succeeds, or by the partition's next owner
						case <-ctx.Done():
						case <-time.After(kafkaRetry.Delay(2)):
						}
					}
					continue
				}
			}
			msg := c.decode(r)
			out = append(out, &kafkaRecord{offset: r.Offset})
			cancel, ok := c.send(ctx, held, msg, r.Offset < vouchFrom) // in offset order
			if !ok {
				out = out[:len(out)-1] // never handed out
				return
			}
			handed = max(handed, r.Offset+1)
			c.settling.Add(1)
			go c.settle(held, r.Offset, msg, cancel, verdicts)
		}
	}
}

// requeue puts r back at the head of the queue.
func (k *kafkaClaim) requeue(r *kgo.Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.queue = append([]*kgo.Record{r}, k.queue...)
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// decode reads a record in watermill-kafka's format; one that can never be read is handed out as
// it came, for the consumer to dead-letter.
func (c *kafkaConsumer) decode(r *kgo.Record) *message.Message {
	cm := &sarama.ConsumerMessage{Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Timestamp: r.Timestamp, Headers: make([]*sarama.RecordHeader, len(r.Headers))}
	for i := range r.Headers {
		cm.Headers[i] = &sarama.RecordHeader{Key: []byte(r.Headers[i].Key), Value: r.Headers[i].Value}
	}
	msg, err := c.s.marshaler.Unmarshal(cm)
	if err == nil {
		return msg
	}
	logs.Warn(c.s.logger, "Cannot read a Kafka record, handing it out to be dead-lettered", err,
		c.fields.Add(watermill.LogFields{"partition": r.Partition, "offset": r.Offset}))
	headers := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	return brokerio.Undecodable(fmt.Sprintf("Kafka record %s/%d offset %d", r.Topic, r.Partition, r.Offset), err, r.Value, headers, kafka.UUIDHeaderKey)
}

// send hands msg out unless the claim ended (ctx), with what ends its context once it is settled
// or the claim stops waiting (held).
func (c *kafkaConsumer) send(ctx, held context.Context, msg *message.Message, redelivered bool) (context.CancelFunc, bool) {
	mctx, cancel := context.WithCancel(held)
	msg.SetContext(outboxkit.WithConsumer(outboxkit.WithRedelivered(mctx, redelivered), c.s.group))
	select {
	case c.out <- msg:
		return cancel, true
	case <-ctx.Done():
		cancel()
		return nil, false
	}
}

// settle waits for the consumer's verdict on msg, handed out, and sends it to verdicts; nothing
// when the claim stopped waiting first (held).
func (c *kafkaConsumer) settle(held context.Context, offset int64, msg *message.Message, cancel context.CancelFunc,
	verdicts chan<- kafkaVerdict) {
	defer c.settling.Done()
	defer cancel()
	var v kafkaVerdict
	select {
	case <-msg.Acked():
		v = kafkaVerdict{offset: offset}
	case <-msg.Nacked():
		v = kafkaVerdict{offset: offset, msg: msg.Copy()}
	case <-held.Done():
		return
	}
	cancel()
	select {
	case verdicts <- v:
	case <-held.Done():
	}
}

// commit commits offset for partition p, with horizon as its metadata, in the member's current
// generation: an error when the member is no longer in the group. A claim commits only while its
// partition is assigned to the member.
func (c *kafkaConsumer) commit(ctx context.Context, p int32, offset, horizon int64) error {
	member, generation := c.cl.GroupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = c.s.group, generation, member
	if c.s.instanceID != "" {
		req.InstanceID = kmsg.StringPtr(c.s.instanceID + "." + c.topic)
	}
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic = c.topic
	if id := c.topicID.Load(); id != nil {
		t.TopicID = *id // v10 on names the topic by id
	}
	tp := kmsg.NewOffsetCommitRequestTopicPartition()
	tp.Partition, tp.Offset, tp.LeaderEpoch = p, offset, -1
	if horizon >= 0 {
		tp.Metadata = kmsg.StringPtr(horizonPrefix + strconv.FormatInt(horizon, 10))
	}
	t.Partitions = append(t.Partitions, tp)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, c.cl)
	if err == nil {
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if err == nil {
					err = kerr.ErrorForCode(rp.ErrorCode)
				}
			}
		}
	}
	if err != nil {
		return fmt.Errorf("commit offset %d of %s/%d: %w", offset, c.topic, p, err)
	}
	return nil
}
