package kafkabackend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
)

// kafkaNackDelay is how long a nacked record waits before it is handed out again.
const kafkaNackDelay = 100 * time.Millisecond

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
			msg := c.s.marshaler.unmarshalRecord(r)
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
