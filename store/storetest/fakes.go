// The fakes the suite drives its forwarders with: a clock moved by hand and a publisher that
// records what it accepts and refuses what a test says.

package storetest

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// clock is a fake clock that tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// sent is one message the fake publisher accepted.
type sent struct {
	topic, uuid, key, seq string
}

// fakePublisher records accepted messages; fail decides per message whether to refuse it.
type fakePublisher struct {
	mu     sync.Mutex
	sent   []sent
	calls  map[string]int
	fail   func(msg *message.Message, call int) error
	notify chan string
}

func newFakePublisher() *fakePublisher { return &fakePublisher{calls: map[string]int{}} }

func (p *fakePublisher) setFail(fn func(msg *message.Message, call int) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = fn
}

func (p *fakePublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		p.mu.Lock()
		p.calls[msg.UUID]++
		call, fail := p.calls[msg.UUID], p.fail
		p.mu.Unlock()
		if fail != nil {
			if err := fail(msg, call); err != nil {
				return err
			}
		}
		p.mu.Lock()
		p.sent = append(p.sent, sent{topic: topic, uuid: msg.UUID, key: outboxkit.PartitionKey(msg), seq: msg.Metadata.Get(outboxkit.MetadataSeq)})
		n := p.notify
		p.mu.Unlock()
		if n != nil {
			n <- msg.UUID
		}
	}
	return nil
}

func (p *fakePublisher) Close() error { return nil }

func (p *fakePublisher) accepted() []sent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]sent(nil), p.sent...)
}

// timesSent counts accepted publishes per UUID.
func (p *fakePublisher) timesSent() map[string]int {
	out := map[string]int{}
	for _, s := range p.accepted() {
		out[s.uuid]++
	}
	return out
}
