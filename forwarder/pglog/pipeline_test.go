package pglog_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// holder is a broker that holds the publishes of one key until released.
type holder struct {
	*recorder
	key      string
	entered  chan struct{} // closed when the first publish of key is held
	enter    sync.Once
	release  chan struct{}
	released sync.Once
}

func newHolder(key string) *holder {
	return &holder{recorder: newRecorder(), key: key, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *holder) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(outboxkit.MetadataPartitionKey) == g.key {
			g.enter.Do(func() { close(g.entered) })
			<-g.release
		}
	}
	return g.recorder.Publish(topic, msgs...)
}

func (g *holder) open() { g.released.Do(func() { close(g.release) }) }

// A key whose publish has not been confirmed holds its own later events alone: the events of other
// keys, and those without a key, decoded after it, are published meanwhile. There is no round for
// them to wait out.
func TestEventsDoNotWaitForAnotherKeysPublish(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := newHolder("slow")
	r := relayOn(t, pg, pub, nil)
	run(t, r)
	t.Cleanup(pub.open) // before the relay stops
	first := write(t, pg, "slow", 1)
	select {
	case <-pub.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow key's event never reached the broker")
	}
	second := write(t, pg, "slow", 1)
	var others []string
	for i := range 5 {
		others = append(others, write(t, pg, fmt.Sprintf("k%d", i), 2)...)
	}
	others = append(others, write(t, pg, "", 2)...)
	testenv.Eventually(t, 10*time.Second, "the other events while the slow key's publish is held", func() bool { return pub.has(others) })
	if pub.count(first[0]) != 0 || pub.count(second[0]) != 0 {
		t.Fatal("an event of the slow key published while its first publish was held")
	}
	pub.open()
	testenv.Eventually(t, 10*time.Second, "the slow key's events once released", func() bool {
		return pub.has(first) && pub.has(second)
	})
	if a, b := pub.index(first[0]), pub.index(second[0]); a > b {
		t.Errorf("the slow key's second event published at %d, before its first at %d", b, a)
	}
}

// tracker is a broker that takes a moment to confirm, and records which keys had more than one
// message in flight at once.
type tracker struct {
	*recorder
	mu        sync.Mutex
	inFlight  map[string]int
	overlaps  []string
	active    int
	maxActive int
}

func (p *tracker) Publish(topic string, msgs ...*message.Message) error {
	key := msgs[0].Metadata.Get(outboxkit.MetadataPartitionKey)
	p.mu.Lock()
	p.inFlight[key]++
	if p.inFlight[key] > 1 && key != "" {
		p.overlaps = append(p.overlaps, key)
	}
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	p.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond) // the broker's confirmation
	err := p.recorder.Publish(topic, msgs...)
	p.mu.Lock()
	p.inFlight[key]--
	p.active--
	p.mu.Unlock()
	return err
}

// Under concurrency — many keys in flight, writers committing meanwhile — a key never has two
// events in flight at once, and its events arrive in commit order.
func TestKeyHasOneEventInFlightInOrder(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	pub := &tracker{recorder: newRecorder(), inFlight: map[string]int{}}
	r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) { f.MaxInFlight = 16 })
	stop := run(t, r)
	const keys, txns = 6, 40
	ids := make([][]string, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() { // one writer a key: its commit order is this loop's
			defer wg.Done()
			for range txns {
				ids[k] = append(ids[k], write(t, pg, fmt.Sprintf("k%d", k), 1+rand.IntN(3))...)
			}
		}()
	}
	wg.Wait()
	var all []string
	for _, k := range ids {
		all = append(all, k...)
	}
	testenv.Eventually(t, 30*time.Second, "every event", func() bool { return pub.has(all) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.overlaps) > 0 {
		t.Errorf("keys with two events in flight at once: %v", pub.overlaps)
	}
	if pub.maxActive < 2 {
		t.Errorf("at most %d event in flight: the keys were not published side by side", pub.maxActive)
	}
	// The payload is "key:index in its transaction"; ids[k] is the key's commit order.
	pub.recorder.mu.Lock()
	defer pub.recorder.mu.Unlock()
	next := map[string]int{}
	for _, m := range pub.order {
		key := strings.SplitN(string(m.Payload), ":", 2)[0]
		k, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
		if i := next[key]; i < len(ids[k]) && ids[k][i] == m.UUID {
			next[key]++
			continue
		}
		t.Errorf("key %s: %s arrived out of commit order (expected %d-th event next)", key, m.UUID, next[key])
		return
	}
	t.Logf("%d events, up to %d in flight", len(all), pub.maxActive)
}
