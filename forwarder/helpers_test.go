package forwarder_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	order int // global order of acceptance
	topic string
	uuid  string
	key   string
	seq   string
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
		p.sent = append(p.sent, sent{order: len(p.sent), topic: topic, uuid: msg.UUID,
			key: outboxkit.PartitionKey(msg), seq: msg.Metadata.Get(outboxkit.MetadataSeq)})
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

var errBroken = errors.New("broker refused the message: schema mismatch")

// write commits events to the outbox, each key's events in order, one transaction per event.
func write(t testing.TB, pg *testenv.PG, keys []string, perKey int) []*message.Message {
	t.Helper()
	ctx := context.Background()
	var all []*message.Message
	for i := 0; i < perKey; i++ {
		for _, k := range keys {
			msg := pipeline.NewEvent("Happened", k, []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i)))
			all = append(all, msg)
		}
	}
	// Batch many events per transaction to keep the setup fast; order within a key is kept.
	for start := 0; start < len(all); start += 500 {
		end := min(start+500, len(all))
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("events", all[start:end]...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// newForwarder builds a forwarder over the test's schema with a fake clock and no jitter.
func newForwarder(t testing.TB, pg *testenv.PG, pub message.Publisher, clk *clock, tune ...func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	cfg := forwarder.Config{
		Pool:           pg.Pool,
		Publisher:      pub,
		Schema:         string(pg.Schema),
		Now:            clk.Now,
		Backoff:        forwarder.Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 2},
		CircuitBackoff: forwarder.Backoff{Initial: time.Second, Max: 10 * time.Second, Multiplier: 2},
	}
	for _, fn := range tune {
		fn(&cfg)
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dispatch(t testing.TB, f *forwarder.Forwarder) forwarder.Result {
	t.Helper()
	res, err := f.DispatchBatch(context.Background())
	if err != nil {
		t.Fatalf("DispatchBatch: %v", err)
	}
	return res
}

// drain runs passes, moving the clock past any backoff, until a pass claims nothing.
func drain(t testing.TB, f *forwarder.Forwarder, clk *clock) {
	t.Helper()
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("outbox did not drain")
		}
		res := dispatch(t, f)
		if res.Claimed == 0 && !res.CircuitOpen {
			return
		}
		clk.Advance(time.Minute)
	}
}
