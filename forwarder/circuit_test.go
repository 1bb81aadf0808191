package forwarder_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// flakyBroker is a publisher whose broker is up or down, and that can Check it as every backend's
// publisher can.
type flakyBroker struct {
	down      atomic.Bool
	refuse    atomic.Bool // the broker refuses the relay's credentials
	checks    atomic.Int64
	publishes atomic.Int64 // publish calls, failed ones included
	mu        sync.Mutex
	got       []string
}

func (b *flakyBroker) failure() error {
	if b.refuse.Load() {
		return outboxkit.AccessDenied(errors.New("ACCESS_REFUSED"))
	}
	if b.down.Load() {
		return outboxkit.Unreachable(errors.New("connection refused"))
	}
	return nil
}

func (b *flakyBroker) Publish(_ string, msgs ...*message.Message) error {
	b.publishes.Add(1)
	if err := b.failure(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		b.got = append(b.got, m.UUID)
	}
	return nil
}

func (b *flakyBroker) Check(context.Context) error {
	b.checks.Add(1)
	return b.failure()
}

func (b *flakyBroker) Close() error { return nil }

func (b *flakyBroker) received() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

// uncheckable hides the broker's Check, as a publisher of another library would.
type uncheckable struct{ message.Publisher }

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func openOutbox(t *testing.T, rows int) *sqlitestore.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.DB().Close() })
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		msg, err := pipeline.NewJSONEvent("OrderPlaced", "o-"+string(rune('a'+i%26)), map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return st
}

func attemptsBurned(t *testing.T, st *sqlitestore.Store) int {
	t.Helper()
	var n int
	if err := st.DB().QueryRow(`SELECT coalesce(sum(attempts), 0) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// However long the broker was away, the relay publishes again within one CircuitWatch of its
// return — not after the circuit's backoff, which by then has grown to its maximum — and the outage
// costs no row an attempt. Time is the injected clock's; every pass is one DispatchBatch.
func TestCircuit_PublishingResumesWithinOneWatchOfTheBrokersReturn(t *testing.T) {
	const watch = 250 * time.Millisecond
	st := openOutbox(t, 20)
	broker := &flakyBroker{}
	broker.down.Store(true)
	clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker, Now: clock.Now, CircuitWatch: watch,
		CircuitBackoff: forwarder.Backoff{Initial: time.Minute, Max: time.Hour, Multiplier: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	res, err := relay.DispatchBatch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.UnreachableErr == nil || !relay.Health().CircuitOpen {
		t.Fatalf("first pass against a broker that is down: %+v, circuit open %v; want it unreachable and the circuit open", res, relay.Health().CircuitOpen)
	}
	publishesInOutage := broker.publishes.Load()

	// Ten minutes away, a pass every 100ms.
	for range 6000 {
		clock.Advance(100 * time.Millisecond)
		res, err := relay.DispatchBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Published > 0 {
			t.Fatalf("a pass during the outage published: %+v", res)
		}
		if !res.CircuitOpen {
			continue // a probe of one row
		}
		if wait := res.RetryAt.Sub(clock.Now()); wait > watch {
			t.Fatalf("during the outage a pass says to come back in %s: want at most the watch, %s", wait, watch)
		}
	}
	// The watch asks with Check and publishes nothing; the backoff's probes (one row at +1, +3 and
	// +7 minutes) remain, in case a Check says yes to a broker that does not take messages.
	if n := broker.publishes.Load() - publishesInOutage; n > 3 {
		t.Errorf("%d publishes during the outage after the first failure: want the backoff's 3 probes at most", n)
	}
	if n := broker.checks.Load(); n < 1900 || n > 2500 {
		// Due every 250ms, asked at the first pass after (passes every 100ms): every 250–300ms.
		t.Errorf("%d checks in 10 minutes with a 250ms watch, want 2,000–2,400", n)
	}
	if n := attemptsBurned(t, st); n != 0 {
		t.Fatalf("%d attempts counted during the outage: an unreachable broker must not burn attempts", n)
	}

	broker.down.Store(false)
	back := clock.Now()
	for broker.received() == 0 {
		if clock.Now().Sub(back) > time.Minute {
			t.Fatal("nothing published a minute after the broker came back")
		}
		clock.Advance(10 * time.Millisecond)
		if _, err := relay.DispatchBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if resumed := clock.Now().Sub(back); resumed > watch {
		t.Fatalf("publishing resumed %s after the broker came back, want within the watch (%s)", resumed, watch)
	}
	for range 100 {
		if _, err := relay.DispatchBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := broker.received(); n != 20 {
		t.Fatalf("%d rows published after the outage, want all 20", n)
	}
	if relay.Health().CircuitOpen {
		t.Fatal("the circuit is still open after the backlog drained")
	}
	if n := attemptsBurned(t, st); n != 0 {
		t.Fatalf("%d attempts counted: an unreachable broker must not burn attempts", n)
	}
}

// A broker that refuses the relay's credentials is not watched four times a second: no outage ends
// that, so its probes keep to CircuitBackoff. A publisher without Check keeps to it as well.
func TestCircuit_RefusalAndPublishersWithoutCheckKeepToTheBackoff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
		wrap   func(*flakyBroker) message.Publisher
	}{
		{"refused", true, func(b *flakyBroker) message.Publisher { return b }},
		{"no Check", false, func(b *flakyBroker) message.Publisher { return uncheckable{b} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := openOutbox(t, 1)
			broker := &flakyBroker{}
			broker.down.Store(true)
			broker.refuse.Store(tc.refuse)
			clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
			relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: tc.wrap(broker), Now: clock.Now,
				CircuitBackoff: forwarder.Backoff{Initial: 10 * time.Second, Max: 10 * time.Second, Multiplier: 1}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for range 600 { // a minute, a pass every 100ms
				if _, err := relay.DispatchBatch(ctx); err != nil {
					t.Fatal(err)
				}
				clock.Advance(100 * time.Millisecond)
			}
			asked := broker.checks.Load() + broker.publishes.Load()
			if asked < 5 || asked > 8 {
				t.Fatalf("the broker was asked %d times in a minute (%d checks, %d publishes), want about 6: once per 10s probe",
					asked, broker.checks.Load(), broker.publishes.Load())
			}
			if n := attemptsBurned(t, st); n != 0 {
				t.Fatalf("%d attempts counted", n)
			}
		})
	}
}

// Run, on the wall clock: with a circuit backoff of a minute, the relay publishes again well within
// a second or two of the broker's return, because it watches the broker rather than waiting the
// backoff out.
func TestCircuit_RunResumesSoonAfterTheBrokerReturns(t *testing.T) {
	st := openOutbox(t, 5)
	broker := &flakyBroker{}
	broker.down.Store(true)
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker,
		CircuitBackoff: forwarder.Backoff{Initial: time.Minute, Max: time.Minute, Multiplier: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "the circuit to open and the broker to be watched", func() bool {
		return relay.Health().CircuitOpen && broker.checks.Load() >= 3
	})
	broker.down.Store(false)
	back := time.Now()
	if !testenv.Within(30*time.Second, func() bool { return broker.received() >= 5 }) {
		t.Fatalf("%d of 5 rows published 30s after the broker came back", broker.received())
	}
	// Generous: the watch is 250ms; the backoff it replaces would have waited a minute.
	if resumed := time.Since(back); resumed > 5*time.Second {
		t.Fatalf("the backlog was published %s after the broker came back, want within a few watches", resumed)
	}
	t.Logf("published again %s after the broker came back", time.Since(back).Round(time.Millisecond))
}

// turns is a broker that is down, and answers its publishes one at a time, in the order the test
// lets them go, once all of them are in.
type turns struct {
	in   chan int
	turn []chan struct{}
}

func (b *turns) Publish(_ string, msgs ...*message.Message) error {
	i := int(msgs[0].Payload[0])
	b.in <- i
	<-b.turn[i]
	return outboxkit.Unreachable(errors.New("connection refused"))
}

func (b *turns) Close() error { return nil }

// Rows in flight when the broker goes away, each published alone (SourceRelay.PublishRow, as the
// log relay does), open the circuit once: one step of its backoff, as one pass's failures take,
// not one per row; the others come back released, their attempts untouched.
func TestCircuit_RowsInFlightOpenItOnce(t *testing.T) {
	const n = 6
	broker := &turns{in: make(chan int, n)}
	for range n {
		broker.turn = append(broker.turn, make(chan struct{}))
	}
	clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	relay, err := forwarder.New(forwarder.Config{Store: openOutbox(t, 0), Publisher: broker, Now: clock.Now,
		CircuitBackoff: forwarder.Backoff{Initial: time.Second, Max: time.Hour, Multiplier: 2}})
	if err != nil {
		t.Fatal(err)
	}
	row := func(i int) store.OutboxRow {
		return store.OutboxRow{Seq: int64(i + 1), UUID: fmt.Sprintf("0193a1f0-0000-7000-8000-%012d", i), Topic: "orders",
			PartitionKey: fmt.Sprintf("o-%d", i), Payload: []byte{byte(i)}, Metadata: []byte(`{}`)}
	}
	err = relay.RunSource(context.Background(), sourceFunc(func(ctx context.Context, src *forwarder.SourceRelay) error {
		out := make([]chan forwarder.Delivery, n)
		for i := range n {
			out[i] = make(chan forwarder.Delivery, 1)
			go func() { out[i] <- src.PublishRow(ctx, row(i)) }()
		}
		for range n {
			<-broker.in // all in flight
		}
		unreachable := 0
		for i := range n {
			close(broker.turn[i])
			d := <-out[i]
			if d.UnreachableErr != nil {
				unreachable++
			}
			if len(d.Published) != 0 || len(d.Failed) != 0 || d.Released != 1 {
				t.Errorf("row %d: published %v, failed %v, released %d; want it released", i, d.Published, d.Failed, d.Released)
			}
		}
		if unreachable != 1 {
			t.Errorf("%d rows reported the broker unreachable, want the first alone", unreachable)
		}
		d := src.PublishRow(ctx, row(0))
		if want := clock.Now().Add(time.Second); !d.CircuitOpen || !d.RetryAt.Equal(want) {
			t.Errorf("after the outage: circuit open %v, probe at %s; want open, probe at %s (one step of the backoff)", d.CircuitOpen, d.RetryAt, want)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
}
