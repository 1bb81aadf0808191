package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

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
		kgo.FetchIsolationLevel(s.conn.isolation()),       // records of aborted transactions are not handed out
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
	resp, err := topicMetadata(ctx, cl, topic)
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

// topicMetadata asks cl for topic's metadata. Asking creates nothing: SubscribeInitialize does.
func topicMetadata(ctx context.Context, cl *kgo.Client, topic string) (*kmsg.MetadataResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	return req.RequestWith(ctx, cl)
}

// Close ends every subscription and waits for them.
func (s *kafkaSubscriber) Close() error { return s.life.Close(nil) }
