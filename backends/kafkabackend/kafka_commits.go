package kafkabackend

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// kafkaCommitGap is the least time between two commits of a partition: an acknowledgement is
// committed at once when the partition's last commit started longer ago, else that much after it,
// with whatever else was acknowledged meanwhile. A process that dies loses to redelivery about what
// it acknowledged in the last gap and the commit in flight, whatever its rate, and a busy partition
// costs the broker at most 1/gap commits a second.
const kafkaCommitGap = 10 * time.Millisecond

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
	for {
		select {
		case <-k.kick:
		case <-ctx.Done():
			return
		}
		if wait := kafkaCommitGap - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
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
