package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/internal/logs"
)

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
	resp, err := topicMetadata(ctx, c.cl, c.topic)
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
