package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// horizonPrefix starts the metadata a member commits with a partition's offset: the first offset
// no member of the group has been handed yet. A member commits a larger horizon before it hands out
// a record at or past the committed one, so that whoever reads the partition next knows which
// records may have been delivered before (below the horizon) and which are first deliveries.
const horizonPrefix = "outboxkit:horizon="

// horizonAhead is how far past the record about to be handed out a member moves the horizon: one
// commit covers that many records (or twice unacked, if more). A member that ends its claim in
// order commits the horizon of what it did hand out; after a crash, up to that many records that
// no one was handed are taken for redeliveries (counted once more than they were delivered).
const horizonAhead = 256

// kafkaCommitEvery is how often a member commits the offsets of what it has acknowledged.
const kafkaCommitEvery = time.Second

// kafkaNackDelay is how long a nacked record waits before it is handed out again.
const kafkaNackDelay = 100 * time.Millisecond

// kafkaSubscriber reads a topic through a consumer group with Sarama, in watermill-kafka's format,
// and commits offsets itself. It replaces watermill-kafka's subscriber for two things:
//
//   - It says which deliveries are first ones (outboxkit.WithRedelivered), from the offsets: a
//     record at or past the horizon committed with the partition's offset (see horizonPrefix) was
//     never handed to a member of the group; one below it may have been (a member read it and died
//     before committing), and so may any record of a partition whose horizon is unknown (committed
//     by another client) that was already there when the partition was assigned. A record handed
//     out again after a nack is a redelivery. middleware.DeliveryCount then writes nothing for a
//     first delivery that succeeds.
//   - It hands out up to unacked records of each partition before the first is acknowledged, in
//     offset order, so that a batching consumer (middleware.BatchConsumer) fills its batches; the
//     offset committed is that of the first record not acknowledged.
type kafkaSubscriber struct {
	brokers   []string
	group     string
	config    func() *sarama.Config
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

// SubscribeInitialize creates the topic with the broker's defaults (partitions, replication) if it
// does not exist: a new group reads it from its oldest offset.
func (s *kafkaSubscriber) SubscribeInitialize(topic string) error {
	admin, err := sarama.NewClusterAdmin(s.brokers, s.config())
	if err != nil {
		return classifyKafka(fmt.Errorf("kafka subscriber: connect: %w", err))
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: -1, ReplicationFactor: -1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) && !strings.Contains(err.Error(), "already exists") {
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
	cfg := s.config()
	if s.instanceID != "" {
		cfg.Consumer.Group.InstanceId = s.instanceID + "." + topic
	}
	client, err := sarama.NewClient(s.brokers, cfg)
	if err != nil {
		s.life.Leave()
		return nil, classifyKafka(fmt.Errorf("kafka subscriber %s: connect: %w", s.group, err))
	}
	group, err := sarama.NewConsumerGroupFromClient(s.group, client)
	if err != nil {
		_ = client.Close()
		s.life.Leave()
		return nil, classifyKafka(fmt.Errorf("kafka subscriber %s: %w", s.group, err))
	}
	out := make(chan *message.Message, s.unacked)
	sctx, stop := context.WithCancel(ctx)
	h := &kafkaGroupHandler{s: s, ctx: sctx, client: client, topic: topic, out: out,
		fields: watermill.LogFields{"topic": topic, "consumer_group": s.group}}
	go func() {
		defer s.life.Leave()
		defer close(out)
		defer stop()
		var loops sync.WaitGroup
		loops.Add(2)
		go func() {
			defer loops.Done()
			select {
			case <-sctx.Done():
			case <-s.life.Closing():
				stop()
			}
		}()
		go func() {
			defer loops.Done()
			for err := range group.Errors() {
				s.logger.Error("Kafka consumer group error", err, h.fields)
			}
		}()
		for attempt := 1; sctx.Err() == nil; {
			err := group.Consume(sctx, []string{topic}, h)
			if sctx.Err() != nil {
				break
			}
			if err == nil {
				attempt = 1
				continue // a rebalance: join again
			}
			wait := kafkaRetry.Delay(attempt)
			attempt++
			s.logger.Error("Cannot consume from Kafka, retrying", err, h.fields.Add(watermill.LogFields{"retry_in": wait}))
			select {
			case <-sctx.Done():
			case <-time.After(wait):
			}
		}
		_ = group.Close() // closes Errors
		_ = client.Close()
		h.settling.Wait()
		loops.Wait()
	}()
	return out, nil
}

// kafkaRetry paces the attempts to consume after a failed one.
var kafkaRetry = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// Close ends every subscription and waits for them.
func (s *kafkaSubscriber) Close() error { return s.life.Close(nil) }

// kafkaGroupHandler is a subscription's sarama.ConsumerGroupHandler.
type kafkaGroupHandler struct {
	s        *kafkaSubscriber
	ctx      context.Context // the subscription's
	client   sarama.Client
	topic    string
	out      chan *message.Message
	fields   watermill.LogFields
	settling sync.WaitGroup

	mu       sync.Mutex
	horizons map[int32]int64 // per partition of the session: records from here on are first deliveries
	commits  map[int32]int64 // per partition: the horizon committed, -1 none
}

// Setup reads, for each partition assigned, the horizon its previous owner committed.
func (h *kafkaGroupHandler) Setup(sess sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.horizons, h.commits = map[int32]int64{}, map[int32]int64{}
	partitions := sess.Claims()[h.topic]
	h.s.logger.Info("Kafka partitions assigned", h.fields.Add(watermill.LogFields{
		"generation": sess.GenerationID(), "member": sess.MemberID(), "partitions": fmt.Sprint(partitions)}))
	if len(partitions) == 0 {
		return nil
	}
	coordinator, err := h.client.Coordinator(h.s.group)
	if err != nil {
		return err
	}
	req := sarama.NewOffsetFetchRequest(h.client.Config().Version, h.s.group, map[string][]int32{h.topic: partitions})
	resp, err := coordinator.FetchOffset(req)
	if err != nil {
		_ = h.client.RefreshCoordinator(h.s.group)
		return err
	}
	for _, p := range partitions {
		h.commits[p] = -1
		block := resp.GetBlock(h.topic, p)
		if block == nil || block.Err != sarama.ErrNoError {
			return fmt.Errorf("read the committed offset of %s/%d: %v", h.topic, p, block)
		}
		if v, ok := strings.CutPrefix(block.Metadata, horizonPrefix); ok {
			if horizon, err := strconv.ParseInt(v, 10, 64); err == nil {
				h.horizons[p], h.commits[p] = horizon, horizon
				continue
			}
		}
		if block.Offset < 0 {
			h.horizons[p] = 0 // nothing committed: nobody handed anything out (a member commits first)
			continue
		}
		// Committed by another client, which says nothing of what it read: only what arrives from
		// now on was never delivered.
		newest, err := h.client.GetOffset(h.topic, p, sarama.OffsetNewest)
		if err != nil {
			return err
		}
		h.horizons[p] = newest
	}
	return nil
}

// Cleanup does nothing: each claim commits what it acknowledged before it ends.
func (h *kafkaGroupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

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

// ConsumeClaim hands the partition's records out, up to unacked at a time, and commits the offset
// of the first one not acknowledged, every kafkaCommitEvery and when the claim ends.
func (h *kafkaGroupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := claim.Partition()
	h.mu.Lock()
	vouchFrom, committed := h.horizons[p], h.commits[p]
	h.mu.Unlock()
	ctx := sess.Context()
	// What is handed out is waited for a little past the session's end (see below).
	held, release := context.WithCancel(h.ctx)
	defer release()
	next := claim.InitialOffset() // the first offset not acknowledged
	if next < 0 {                 // nothing committed: the oldest
		oldest, err := h.client.GetOffset(h.topic, p, sarama.OffsetOldest)
		if err != nil {
			return err
		}
		next = oldest
	}
	lastCommit := next
	handed := max(next, vouchFrom) // past what this member, and any before it, may have handed out
	var (
		out      []*kafkaRecord // handed out, in offset order
		verdicts = make(chan kafkaVerdict, h.s.unacked)
		tick     = time.NewTicker(kafkaCommitEvery)
	)
	defer tick.Stop()
	fields := h.fields.Add(watermill.LogFields{"partition": p})
	commit := func(ctx context.Context, horizon int64) error {
		err := h.commit(ctx, sess, p, next, horizon)
		if err == nil {
			lastCommit, committed = next, horizon
		}
		return err
	}
	apply := func(v kafkaVerdict) {
		if v.msg != nil { // nacked: handed out again, held still
			h.settling.Add(1)
			go func() {
				select {
				case <-time.After(kafkaNackDelay):
				case <-ctx.Done():
					h.settling.Done()
					return
				}
				cancel, ok := h.send(ctx, held, v.msg, true)
				if !ok {
					h.settling.Done()
					return
				}
				h.settle(held, v.offset, v.msg, cancel, verdicts)
			}()
			return
		}
		for _, r := range out {
			if r.offset == v.offset {
				r.acked = true
			}
		}
		for len(out) > 0 && out[0].acked {
			next = out[0].offset + 1
			out = out[1:]
		}
	}
	defer func() {
		// The claim ends (a rebalance, the subscription's end): give what is held a moment to be
		// settled, then commit what was acknowledged, while the generation is still valid.
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
		// The horizon comes back to what was handed out: the partition's next owner takes the
		// records past it for first deliveries.
		if horizon := max(handed, next); next != lastCommit || horizon != committed {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := commit(cctx, horizon); err != nil {
				h.s.logger.Info("Cannot commit at the end of a claim; its records will be read again", fields.Add(watermill.LogFields{"err": err}))
			}
			cancel()
		}
	}()
	full := false // the window filled up: hand out again once half of it is settled, in a run
	for {
		var records <-chan *sarama.ConsumerMessage
		if len(out) >= h.s.unacked {
			full = true
		} else if full && len(out) <= h.s.unacked/2 {
			full = false
		}
		if !full {
			records = claim.Messages()
		}
		select {
		case <-ctx.Done():
			return nil
		case v := <-verdicts:
			apply(v)
		case <-tick.C:
			if next != lastCommit {
				if err := commit(ctx, committed); err != nil && ctx.Err() == nil {
					h.s.logger.Error("Cannot commit offsets", err, fields)
				}
			}
		case cm, ok := <-records:
			if !ok {
				return nil
			}
			if cm.Offset >= committed {
				// Past the horizon: record a new one before handing this record out.
				if err := commit(ctx, cm.Offset+int64(max(horizonAhead, 2*h.s.unacked))); err != nil {
					if ctx.Err() == nil {
						h.s.logger.Error("Cannot commit the group's read horizon; the claim ends", err, fields)
					}
					return nil // the record is read again by the partition's next owner
				}
			}
			msg, err := h.s.marshaler.Unmarshal(cm)
			if err != nil {
				// It can never be read: handed out as it came, for the consumer to dead-letter.
				logs.Warn(h.s.logger, "Cannot read a Kafka record, handing it out to be dead-lettered", err,
					fields.Add(watermill.LogFields{"offset": cm.Offset}))
				headers := make(map[string]string, len(cm.Headers))
				for _, rh := range cm.Headers {
					headers[string(rh.Key)] = string(rh.Value)
				}
				msg = brokerio.Undecodable(fmt.Sprintf("Kafka record %s/%d offset %d", cm.Topic, cm.Partition, cm.Offset), err, cm.Value, headers, kafka.UUIDHeaderKey)
			}
			out = append(out, &kafkaRecord{offset: cm.Offset})
			cancel, ok := h.send(ctx, held, msg, cm.Offset < vouchFrom) // in offset order
			if !ok {
				out = out[:len(out)-1] // never handed out
				return nil
			}
			handed = max(handed, cm.Offset+1)
			h.settling.Add(1)
			go h.settle(held, cm.Offset, msg, cancel, verdicts)
		}
	}
}

// send hands msg out unless the session ended (ctx), with what ends its context once it is settled
// or the claim stops waiting (held).
func (h *kafkaGroupHandler) send(ctx, held context.Context, msg *message.Message, redelivered bool) (context.CancelFunc, bool) {
	mctx, cancel := context.WithCancel(held)
	msg.SetContext(outboxkit.WithConsumer(outboxkit.WithRedelivered(mctx, redelivered), h.s.group))
	select {
	case h.out <- msg:
		return cancel, true
	case <-ctx.Done():
		cancel()
		return nil, false
	}
}

// settle waits for the consumer's verdict on msg, handed out, and sends it to verdicts; nothing
// when the claim stopped waiting first (held).
func (h *kafkaGroupHandler) settle(held context.Context, offset int64, msg *message.Message, cancel context.CancelFunc,
	verdicts chan<- kafkaVerdict) {
	defer h.settling.Done()
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

// commit commits offset for partition p, with horizon as its metadata, in the session's
// generation: an error when the group has moved on (the partition is no longer this member's).
func (h *kafkaGroupHandler) commit(ctx context.Context, sess sarama.ConsumerGroupSession, p int32, offset, horizon int64) error {
	coordinator, err := h.client.Coordinator(h.s.group)
	if err != nil {
		return err
	}
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: h.s.group, ConsumerGroupGeneration: sess.GenerationID(),
		ConsumerID: sess.MemberID(), RetentionTime: -1}
	meta := ""
	if horizon >= 0 {
		meta = horizonPrefix + strconv.FormatInt(horizon, 10)
	}
	req.AddBlock(h.topic, p, offset, 0, meta)
	done := make(chan error, 1)
	go func() {
		resp, err := coordinator.CommitOffset(req)
		if err == nil {
			if kerr, ok := resp.Errors[h.topic][p]; ok && kerr != sarama.ErrNoError {
				err = kerr
			}
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = h.client.RefreshCoordinator(h.s.group)
		return fmt.Errorf("commit offset %d of %s/%d: %w", offset, h.topic, p, err)
	}
	return nil
}
