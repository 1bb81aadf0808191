package kafkabackend

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kafkaCommitGap is the least time between two commits of a partition in the first
// kafkaCommitQuickFor of a claim, and whenever the claim waits for a commit (its read horizon, its
// end): an acknowledgement is committed at once when the partition's last commit started longer
// ago, else that much after it, with whatever else was acknowledged meanwhile. A process that dies
// soon after it started — a crash loop — loses to redelivery about what it acknowledged in the
// last gap and the commit in flight, whatever its rate, and so gets through its backlog between
// crashes.
const kafkaCommitGap = 10 * time.Millisecond

// kafkaCommitQuickFor is how long a claim commits acknowledgements kafkaCommitGap apart; after it,
// kafkaCommitBusyGap apart: a busy partition costs the broker, and the member's CPU, at most 1/gap
// commits a second (with commits 10 ms apart throughout, batching consumers on four partitions
// drained at 0.78–0.81× of their rate before commits followed the acknowledgements; with this gap
// at 0.95–1.02×, internal/cmd/bench/results/2026-12-02-kafka-commit-gap.txt), and a process that dies after that
// loses to redelivery what it acknowledged in the last kafkaCommitBusyGap.
const (
	kafkaCommitQuickFor = time.Second
	kafkaCommitBusyGap  = 100 * time.Millisecond
)

// kafkaCommitAsk is what a claim wants committed: the first offset not acknowledged, and the read
// horizon (see horizonPrefix).
type kafkaCommitAsk struct{ offset, horizon int64 }

// kafkaCommits commits a claim's offsets in the background, one commit at a time and in the order
// asked: a commit carries the latest ask when it starts, and asks made meanwhile go with the next.
// So the offset committed moves with the acknowledgements, not a tick behind them, and the claim
// never waits for the broker except to move its horizon (wait).
type kafkaCommits struct {
	c *kafkaConsumer
	p int32

	mu       sync.Mutex
	asked    kafkaCommitAsk
	askedN   uint64 // asks made
	flying   *kafkaCommitAsk
	stored   kafkaCommitAsk // what the broker holds, as far as this member knows (-1: nothing)
	doneN    uint64         // the asks the last finished commit covered
	doneErr  error
	finished chan struct{} // closed, and replaced, when a commit finishes
	kick     chan struct{}
	hurried  bool // the claim ends: kafkaCommitGap apart from now on
}

func newKafkaCommits(c *kafkaConsumer, p int32, offset, horizon int64) *kafkaCommits {
	s := kafkaCommitAsk{offset: offset, horizon: horizon}
	return &kafkaCommits{c: c, p: p, asked: s, stored: s, finished: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// ask asks for a commit of a, and returns its number for wait.
func (k *kafkaCommits) ask(a kafkaCommitAsk) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if a == k.asked {
		return k.askedN
	}
	k.asked = a
	k.askedN++
	select {
	case k.kick <- struct{}{}:
	default:
	}
	return k.askedN
}

// wait waits until a commit covering ask n has finished, and returns its error.
func (k *kafkaCommits) wait(ctx context.Context, n uint64) error {
	for {
		k.mu.Lock()
		if k.doneN >= n {
			err := k.doneErr
			k.mu.Unlock()
			return err
		}
		finished := k.finished
		k.mu.Unlock()
		select {
		case <-finished:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// hurry commits kafkaCommitGap apart from now on, as at the claim's start: the claim ends, and
// waits for its last commit.
func (k *kafkaCommits) hurry() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hurried = true
}

// gap is the least time between the last commit and the next one.
func (k *kafkaCommits) gap(started time.Time) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.hurried || time.Since(started) < kafkaCommitQuickFor || k.asked.horizon > k.stored.horizon {
		return kafkaCommitGap // a claim waits for a horizon it moves (when hand-outs catch up with it)
	}
	return kafkaCommitBusyGap
}

// horizonFloor is the lowest horizon the broker holds or may yet hold from what was asked: a record
// at or past it must not be handed out, as a crash could leave that horizon stored.
func (k *kafkaCommits) horizonFloor() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	floor := min(k.stored.horizon, k.asked.horizon)
	if k.flying != nil {
		floor = min(floor, k.flying.horizon)
	}
	return floor
}

// run commits what is asked until ctx ends.
func (k *kafkaCommits) run(ctx context.Context) {
	var last time.Time
	started := time.Now()
	for {
		select {
		case <-k.kick:
		case <-ctx.Done():
			return
		}
		for {
			wait := k.gap(started) - time.Since(last)
			if wait <= 0 {
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-k.kick: // a later ask, maybe one the claim waits for: a shorter gap
				t.Stop()
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		k.mu.Lock()
		a, n := k.asked, k.askedN
		if a == k.stored {
			k.doneN, k.doneErr = n, nil
			k.finishLocked()
			k.mu.Unlock()
			continue
		}
		k.flying = &a
		k.mu.Unlock()
		last = time.Now()
		err := k.c.commit(ctx, k.p, a.offset, a.horizon)
		k.mu.Lock()
		k.flying = nil
		if err == nil {
			k.stored = a
		} else {
			// It may have been stored all the same: the lower horizon of the two is what may hold.
			k.stored.horizon = min(k.stored.horizon, a.horizon)
		}
		k.doneN, k.doneErr = n, err
		k.finishLocked()
		k.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			k.c.s.logger.Error("Cannot commit offsets; trying again", err, k.c.fields.Add(watermill.LogFields{"partition": k.p}))
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			select {
			case k.kick <- struct{}{}:
			default:
			}
		}
	}
}

func (k *kafkaCommits) finishLocked() {
	close(k.finished)
	k.finished = make(chan struct{})
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
