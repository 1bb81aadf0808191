package storetest

import (
	"context"
	"errors"
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
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
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

var errBroken = errors.New("broker refused the message: schema mismatch")

// write commits events to the outbox, each key's events in order, many per transaction.
func write[TTx any](t testing.TB, e *Env[TTx], keys []string, perKey int) []*message.Message {
	t.Helper()
	var all []*message.Message
	for i := 0; i < perKey; i++ {
		for _, k := range keys {
			all = append(all, pipeline.NewEvent("Happened", k, []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i))))
		}
	}
	for start := 0; start < len(all); start += 500 {
		end := min(start+500, len(all))
		if err := e.InTx(context.Background(), func(tx TTx) error {
			pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
			if err != nil {
				return err
			}
			return pub.Publish("events", all[start:end]...)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// newForwarder builds a forwarder over s with a fake clock and no jitter.
func newForwarder(t testing.TB, s store.Store, pub message.Publisher, clk *clock, tune ...func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	cfg := forwarder.Config{
		Store:          s,
		Publisher:      pub,
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

// assertPerKeyOrder checks that each key's accepted messages came in increasing seq order.
func assertPerKeyOrder(t *testing.T, accepted []sent) {
	t.Helper()
	last := map[string]int64{}
	for _, s := range accepted {
		seq, err := strconv.ParseInt(s.seq, 10, 64)
		if err != nil {
			t.Fatalf("message %s has no seq stamp", s.uuid)
		}
		if seq <= last[s.key] {
			t.Fatalf("key %s: seq %d published after seq %d", s.key, seq, last[s.key])
		}
		last[s.key] = seq
	}
}

func keysN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%02d", i)
	}
	return out
}

const pending = `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`

func forwarderTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"CrashAfterCommitBeforePublish", crashAfterCommitBeforePublish[TTx]},
		{"MessageCarriesIdentityAndOrigin", messageCarriesIdentityAndOrigin[TTx]},
		{"FailureBacksOffThenSucceeds", failureBacksOffThenSucceeds[TTx]},
		{"DeadLetterThenReplay", deadLetterThenReplay[TTx]},
		{"CrashAfterPublishBeforeMark", crashAfterPublishBeforeMark[TTx]},
		{"TwoForwardersAtOnce", twoForwardersAtOnce[TTx]},
		{"PerKeyOrderWithRandomFailures", perKeyOrderWithRandomFailures[TTx]},
		{"FailingKeyDoesNotHoldUpOthers", failingKeyDoesNotHoldUpOthers[TTx]},
		{"ParkKeyOnDeadLetter", parkKeyOnDeadLetter[TTx]},
		{"ReplayedHeadWaitsForNothingButBackingOffRowsStillBlock", replayedHeadWaitsForNothing[TTx]},
		{"BrokerOutageOpensCircuitWithoutBurningAttempts", brokerOutage[TTx]},
		{"MalformedRowIsDeadLetteredNotBlocking", malformedRow[TTx]},
		{"PrunePublished", prunePublished[TTx]},
		{"DeleteOnPublish", deleteOnPublish[TTx]},
		{"Stats", outboxStats[TTx]},
		{"StuckKeyWithLongBacklogDoesNotStarveOthers", stuckKeyDoesNotStarve[TTx]},
		{"RowHeldElsewhereHoldsBackTheRestOfItsKey", rowHeldElsewhere[TTx]},
		{"DeadLetterListingAndFilters", deadLetterListing[TTx]},
		{"PermanentFailureDeadLettersAtOnce", permanentFailureDeadLettersAtOnce[TTx]},
		{"AccessDeniedHoldsAndRefusesToStart", accessDeniedHoldsAndRefusesToStart[TTx]},
		{"RunRefusesUnmigratedTables", runRefusesUnmigratedTables[TTx]},
	}
}

// Failure matrix, "crash after commit, before publish": the writer committed, and the relay that
// claimed the rows died before publishing any. The rows stay pending, the relay's hold on them
// dies with it, and the restarted relay publishes each exactly once.
func crashAfterCommitBeforePublish[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b"}, 3)
	pub := newFakePublisher()
	clk := newClock()
	dying := newForwarder(t, e.Store, pub, clk)
	crash := errors.New("relay died after claiming, before publishing")
	faults.Inject(dying, faults.BeforePublish, func() error { return crash })
	if _, err := dying.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := len(pub.timesSent()); n != 0 {
		t.Fatalf("%d messages published by the relay that died before publishing", n)
	}
	if n := e.MustInt(t, pending); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}
	res := dispatch(t, newForwarder(t, e.Store, pub, clk))
	if res.Claimed != 6 || res.Published != 6 {
		t.Fatalf("result = %+v, want 6 claimed and published", res)
	}
	for _, m := range msgs {
		if n := pub.timesSent()[m.UUID]; n != 1 {
			t.Errorf("message %s published %d times, want 1", m.UUID, n)
		}
	}
	if n := e.MustInt(t, pending); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

func messageCarriesIdentityAndOrigin[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"order-1"}, 1)
	var got *message.Message
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error { got = m; return nil })
	dispatch(t, newForwarder(t, e.Store, pub, newClock(), func(c *forwarder.Config) {
		c.TopicMapping = func(topic, key string) string { return "prod." + topic + "." + key }
	}))
	if got == nil || got.UUID != msgs[0].UUID || string(got.Payload) != string(msgs[0].Payload) {
		t.Fatalf("published %+v, want the outbox message %s", got, msgs[0].UUID)
	}
	if outboxkit.PartitionKey(got) != "order-1" || outboxkit.EventType(got) != "Happened" {
		t.Errorf("metadata lost: %v", got.Metadata)
	}
	if created, ok := outboxkit.CreatedAt(got); !ok || time.Since(created) > time.Minute || time.Until(created) > time.Minute {
		t.Errorf("created_at stamp = %q", got.Metadata.Get(outboxkit.MetadataCreatedAt))
	}
	if s := pub.accepted(); s[0].topic != "prod.events.order-1" {
		t.Errorf("topic = %q, want the mapped prod.events.order-1", s[0].topic)
	}
}

func failureBacksOffThenSucceeds[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"k"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(_ *message.Message, call int) error {
		if call == 1 {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk) // backoff: 1s after the first failure, no jitter
	if res := dispatch(t, f); res.Failed != 1 || res.Published != 0 {
		t.Fatalf("first pass = %+v, want one failure", res)
	}
	if n := e.MustInt(t, `SELECT attempts FROM {{schema}}.outbox WHERE uuid = ?`, msgs[0].UUID); n != 1 {
		t.Fatalf("attempts = %d, want 1", n)
	}
	letters, err := e.Store.OutboxDeadLetters(context.Background(), store.DeadLetterFilter{})
	if err != nil || len(letters) != 0 {
		t.Fatalf("a row backing off is listed as dead: %v %v", letters, err)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE last_error LIKE ?`, "%"+errBroken.Error()+"%"); n != 1 {
		t.Fatal("last_error does not hold the publisher's error")
	}
	if res := dispatch(t, f); res.Claimed != 0 {
		t.Fatalf("immediate second pass claimed %d rows; the row is not due yet", res.Claimed)
	}
	clk.Advance(999 * time.Millisecond)
	if res := dispatch(t, f); res.Claimed != 0 {
		t.Fatalf("pass just before the backoff ends claimed %d rows", res.Claimed)
	}
	clk.Advance(2 * time.Millisecond)
	if res := dispatch(t, f); res.Published != 1 {
		t.Fatalf("pass after the backoff = %+v, want the row published", res)
	}
	if got := len(pub.accepted()); got != 1 {
		t.Fatalf("accepted %d messages, want 1", got)
	}
}

func deadLetterThenReplay[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"k"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	var broken sync.Mutex
	isBroken := true
	pub.setFail(func(*message.Message, int) error {
		broken.Lock()
		defer broken.Unlock()
		if isBroken {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 3 })
	dead := 0
	for i := 0; i < 100; i++ {
		dead += dispatch(t, f).DeadLettered
		clk.Advance(time.Hour)
	}
	if dead != 1 {
		t.Fatalf("dead-lettered %d times, want once", dead)
	}
	if n := e.MustInt(t, `SELECT attempts FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`); n != 3 {
		t.Fatalf("attempts = %d, want 3 and dead-lettered", n)
	}
	if s, _ := f.Stats(context.Background()); s.DeadLettered != 1 || s.Pending != 0 {
		t.Fatalf("stats = %+v", s)
	}
	broken.Lock()
	isBroken = false
	broken.Unlock()
	for i := 0; i < 5; i++ {
		dispatch(t, f)
		clk.Advance(time.Hour)
	}
	if n := len(pub.accepted()); n != 0 {
		t.Fatalf("a dead-lettered row was published %d times before replay", n)
	}
	if _, err := f.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{}); !errors.Is(err, store.ErrEmptyFilter) {
		t.Fatalf("an empty filter replayed (%v); it must demand a selection or All", err)
	}
	letters, err := f.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{MessageIDs: []string{msgs[0].UUID}})
	if err != nil || len(letters) != 1 || letters[0].MessageID != msgs[0].UUID {
		t.Fatalf("replay = %v, %v", letters, err)
	}
	drain(t, f, clk)
	if got := pub.timesSent()[msgs[0].UUID]; got != 1 {
		t.Fatalf("replayed row published %d times, want exactly once", got)
	}
}

func crashAfterPublishBeforeMark[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b", "c"}, 2)
	clk := newClock()
	pub := newFakePublisher()
	f := newForwarder(t, e.Store, pub, clk)
	crash := errors.New("process died between publish and mark")
	faults.Inject(f, faults.AfterPublish, func() error { return crash })
	if _, err := f.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := e.MustInt(t, pending); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}
	clk.Advance(time.Hour) // past any lease the dead relay held
	restarted := newForwarder(t, e.Store, pub, clk)
	drain(t, restarted, clk)
	counts := pub.timesSent()
	for _, m := range msgs {
		if counts[m.UUID] != 2 {
			t.Errorf("message %s published %d times, want 2 (a duplicate, never a loss)", m.UUID, counts[m.UUID])
		}
	}
}

func twoForwardersAtOnce[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, keysN(40), 50)
	clk := newClock()
	pub := newFakePublisher() // shared: its log is the broker's view of both relays
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		f := newForwarder(t, e.Another(t), pub, clk, func(c *forwarder.Config) {
			c.BatchSize = 37
			c.MaxInFlight = 8
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for idle := 0; idle < 3; {
				res, err := f.DispatchBatch(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if res.Claimed == 0 {
					idle++
				} else {
					idle = 0
				}
			}
		}()
	}
	wg.Wait()
	if n := e.MustInt(t, pending); n != 0 {
		t.Fatalf("%d rows left pending", n)
	}
	counts := pub.timesSent()
	for _, m := range msgs {
		if counts[m.UUID] != 1 {
			t.Fatalf("message %s published %d times by two relays, want exactly once", m.UUID, counts[m.UUID])
		}
	}
	assertPerKeyOrder(t, pub.accepted())
}

func perKeyOrderWithRandomFailures[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, keysN(20), 200)
	clk := newClock()
	pub := newFakePublisher()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	failures := 0
	pub.setFail(func(*message.Message, int) error {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(10) == 0 {
			failures++
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) {
		c.MaxAttempts = 1000 // every failure retried: order must hold through them
		c.Backoff = forwarder.Backoff{Initial: time.Second, Max: time.Second, Multiplier: 1}
	})
	drain(t, f, clk)
	if failures < 100 {
		t.Fatalf("only %d injected failures; the test would prove little", failures)
	}
	accepted := pub.accepted()
	if len(accepted) != len(msgs) {
		t.Fatalf("accepted %d messages, want %d", len(accepted), len(msgs))
	}
	assertPerKeyOrder(t, accepted)
}

func failingKeyDoesNotHoldUpOthers[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"stuck", "a", "b", "c"}, 25)
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "stuck" {
			return errBroken
		}
		return nil
	})
	res := dispatch(t, newForwarder(t, e.Store, pub, newClock()))
	if res.Published != 75 || res.Failed != 1 {
		t.Fatalf("first pass = %+v; want the 75 rows of healthy keys published and 1 failure", res)
	}
	for _, s := range pub.accepted() {
		if s.key == "stuck" {
			t.Fatalf("a row of the failing key was published past its failed head")
		}
	}
	if n := e.MustInt(t, pending+` AND partition_key = 'stuck'`); n != 25 {
		t.Fatalf("stuck key has %d pending rows, want 25", n)
	}
}

func parkKeyOnDeadLetter[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park=%v", park), func(t *testing.T) {
			t.Parallel()
			e := migrated(t, h)
			msgs := write(t, e, []string{"k"}, 3)
			clk := newClock()
			pub := newFakePublisher()
			pub.setFail(func(m *message.Message, _ int) error {
				if m.UUID == msgs[0].UUID {
					return errBroken
				}
				return nil
			})
			f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) {
				c.MaxAttempts = 1
				c.ParkKeyOnDeadLetter = park
			})
			drain(t, f, clk)
			published := len(pub.accepted())
			if park && published != 0 {
				t.Fatalf("park: %d later rows overtook the dead-lettered head", published)
			}
			if !park && published != 2 {
				t.Fatalf("no park: %d later rows published, want 2", published)
			}
			if park {
				pub.setFail(nil)
				if _, err := f.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{PartitionKey: "k"}); err != nil {
					t.Fatal(err)
				}
				drain(t, f, clk)
				got := pub.accepted()
				if len(got) != 3 {
					t.Fatalf("after replay %d published, want 3", len(got))
				}
				assertPerKeyOrder(t, got)
			}
		})
	}
}

// A replayed row regains its place at the head of its key; a later row of that key that is
// backing off still holds back everything behind it.
func replayedHeadWaitsForNothing[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"k"}, 3)
	clk := newClock()
	pub := newFakePublisher()
	failing := map[string]bool{msgs[0].UUID: true}
	var mu sync.Mutex
	pub.setFail(func(m *message.Message, _ int) error {
		mu.Lock()
		defer mu.Unlock()
		if failing[m.UUID] {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	dispatch(t, f) // row 1 dead-lettered at once
	mu.Lock()
	failing = map[string]bool{msgs[1].UUID: true}
	mu.Unlock()
	f2 := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 5 })
	dispatch(t, f2) // row 2 fails once: backing off for a second
	if _, err := f2.ReplayOutboxDeadLetters(context.Background(), store.DeadLetterFilter{MessageIDs: []string{msgs[0].UUID}}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	failing = map[string]bool{}
	mu.Unlock()
	res := dispatch(t, f2)
	got := pub.accepted()
	if res.Published != 1 || len(got) != 1 || got[0].uuid != msgs[0].UUID {
		t.Fatalf("pass = %+v, accepted %v; want only the replayed row 1 (row 2 backs off, row 3 waits for it)", res, got)
	}
	clk.Advance(time.Minute)
	drain(t, f2, clk)
	assertPerKeyOrder(t, pub.accepted())
}

func brokerOutage[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a", "b", "c", "d"}, 10)
	clk := newClock()
	pub := newFakePublisher()
	var mu sync.Mutex
	down := true
	pub.setFail(func(*message.Message, int) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return outboxkit.Unreachable(errors.New("dial tcp: connection refused"))
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 2 })
	res := dispatch(t, f)
	if res.UnreachableErr == nil || res.Failed != 0 {
		t.Fatalf("pass during outage = %+v, want an unreachable error and no counted failure", res)
	}
	res = dispatch(t, f)
	if !res.CircuitOpen || res.Claimed != 0 {
		t.Fatalf("pass with the circuit open = %+v, want it to do nothing", res)
	}
	for i := 0; i < 50; i++ { // a long outage: many probes, each failing
		clk.Advance(time.Minute)
		dispatch(t, f)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows had attempts burned by the outage", n)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	clk.Advance(time.Minute)
	if res := dispatch(t, f); res.Published != 1 {
		t.Fatalf("probe pass = %+v, want one row published", res)
	}
	drain(t, f, clk)
	if got := len(pub.accepted()); got != 40 {
		t.Fatalf("after the outage %d of 40 published", got)
	}
}

func malformedRow[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	ctx := context.Background()
	// A row another writer stored with metadata that is not an object of strings.
	if err := e.InTx(ctx, func(tx TTx) error {
		return e.Store.UnwrapTx(tx).InsertOutbox(ctx, []store.OutboxMessage{{UUID: "bad-1", Topic: "events", PartitionKey: "k",
			Payload: []byte{}, Metadata: []byte(`{"n": 1}`)}})
	}); err != nil {
		t.Fatal(err)
	}
	good := write(t, e, []string{"other"}, 3)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if m.UUID == good[0].UUID {
			panic("publisher bug")
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 2 })
	drain(t, f, clk)
	letters, err := e.Store.OutboxDeadLetters(ctx, store.DeadLetterFilter{MessageIDs: []string{"bad-1"}})
	if err != nil || len(letters) != 1 || !strings.Contains(letters[0].Reason, "metadata is not a JSON object of strings") {
		t.Fatalf("malformed row's dead letter = %+v (%v); want it dead-lettered with the reason", letters, err)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d dead letters, want the malformed row and the one that panicked", n)
	}
	if got := len(pub.accepted()); got != 2 {
		t.Fatalf("%d good rows published, want 2", got)
	}
}

func prunePublished[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 30)
	clk := newClock()
	f := newForwarder(t, e.Store, newFakePublisher(), clk, func(c *forwarder.Config) {
		c.BatchSize = 20 // 20 published now, 10 left pending
		c.Retention.Age = 24 * time.Hour
		c.Retention.BatchSize = 7 // several bounded statements
	})
	dispatch(t, f)
	clk.Advance(23 * time.Hour)
	if n, err := f.PrunePublished(context.Background()); err != nil || n != 0 {
		t.Fatalf("prune before the retention age deleted %d (%v)", n, err)
	}
	clk.Advance(2 * time.Hour)
	n, err := f.PrunePublished(context.Background())
	if err != nil || n != 20 {
		t.Fatalf("prune after the retention age deleted %d (%v), want 20", n, err)
	}
	if left := e.MustInt(t, pending); left != 10 {
		t.Fatalf("%d pending rows left, want 10 untouched", left)
	}
}

func deleteOnPublish[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 5)
	f := newForwarder(t, e.Store, newFakePublisher(), newClock(), func(c *forwarder.Config) { c.Retention.DeleteOnPublish = true })
	if res := dispatch(t, f); res.Published != 5 {
		t.Fatalf("result = %+v", res)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("%d rows left; DeleteOnPublish keeps nothing", n)
	}
}

func outboxStats[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a", "b"}, 2)
	clk := newClock()
	clk.Advance(90 * time.Second)
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "a" {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	s, err := f.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending != 4 || s.OldestPendingAge < 85*time.Second || s.OldestPendingAge > 5*time.Minute || s.DeadLettered != 0 {
		t.Fatalf("stats before = %+v", s)
	}
	dispatch(t, f) // a's head dead-lettered, b published
	clk.Advance(time.Minute)
	s, _ = f.Stats(context.Background())
	if s.Pending != 1 || s.DeadLettered != 1 || s.OldestDeadLettered.Round(time.Millisecond) != time.Minute {
		t.Fatalf("stats after = %+v; want 1 pending (a's second row), 1 dead letter a minute old", s)
	}
}

// A key whose head must wait and whose backlog is longer than the claim window must not starve
// the keys written after it: the window skips the stuck key instead of filling up with it.
func stuckKeyDoesNotStarve[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, mode := range []string{"backing off", "parked behind a dead letter"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := migrated(t, h)
			write(t, e, []string{"stuck"}, 100) // oldest rows: all of one key
			write(t, e, []string{"a", "b", "c"}, 10)
			pub := newFakePublisher()
			pub.setFail(func(m *message.Message, _ int) error {
				if outboxkit.PartitionKey(m) == "stuck" {
					return errBroken
				}
				return nil
			})
			f := newForwarder(t, e.Store, pub, newClock(), func(c *forwarder.Config) {
				c.BatchSize = 20
				if mode != "backing off" {
					c.MaxAttempts = 1
					c.ParkKeyOnDeadLetter = true
				}
			})
			if res := dispatch(t, f); res.Failed != 1 {
				t.Fatalf("first pass = %+v, want the stuck head to fail", res)
			}
			// The clock does not move: the stuck key is still waiting in the second pass.
			if res := dispatch(t, f); res.Published != 20 {
				t.Fatalf("second pass = %+v; want 20 rows of the other keys published past the stuck key", res)
			}
			for _, s := range pub.accepted() {
				if s.key == "stuck" {
					t.Fatal("a row of the stuck key was published")
				}
			}
		})
	}
}

// Another relay holding a row in the middle of a key's run leaves a hole in this relay's window:
// the rows after the hole must wait, the rows before it may go.
func rowHeldElsewhere[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"k"}, 4)
	write(t, e, []string{"other"}, 2)
	seq2 := e.MustInt(t, `SELECT seq FROM {{schema}}.outbox WHERE uuid = ?`, msgs[1].UUID)
	release := e.HoldRow(t, int64(seq2)) // "another relay"
	defer release()
	pub := newFakePublisher()
	res := dispatch(t, newForwarder(t, e.Store, pub, newClock()))
	got := map[string]bool{}
	for _, s := range pub.accepted() {
		got[s.uuid] = true
	}
	if !got[msgs[0].UUID] || got[msgs[2].UUID] || got[msgs[3].UUID] || res.Published != 3 {
		t.Fatalf("pass = %+v; want row 1 of k and both rows of other published, rows 3 and 4 of k held back behind the held row 2", res)
	}
}

func deadLetterListing[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b", "c"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "c" {
			return nil
		}
		return fmt.Errorf("refused %s", outboxkit.PartitionKey(m))
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	dispatch(t, f)
	ctx := context.Background()
	all, err := e.Store.OutboxDeadLetters(ctx, store.DeadLetterFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("listing = %d rows, %v; want the 2 dead letters", len(all), err)
	}
	if all[0].MessageID != msgs[0].UUID || all[0].Reason != "refused a" || all[0].PartitionKey != "a" ||
		all[0].Attempts != 1 || all[0].Metadata[outboxkit.MetadataEventType] != "Happened" || all[0].CreatedAt.IsZero() {
		t.Fatalf("first dead letter = %+v", all[0])
	}
	for name, c := range map[string]struct {
		f    store.DeadLetterFilter
		want int
	}{
		"error text":    {store.DeadLetterFilter{ReasonContains: "refused b"}, 1},
		"key":           {store.DeadLetterFilter{PartitionKey: "a"}, 1},
		"topic":         {store.DeadLetterFilter{Topic: "events"}, 2},
		"other topic":   {store.DeadLetterFilter{Topic: "nope"}, 0},
		"since later":   {store.DeadLetterFilter{From: clk.Now().Add(time.Minute)}, 0},
		"until later":   {store.DeadLetterFilter{Until: clk.Now().Add(time.Minute)}, 2},
		"uuid":          {store.DeadLetterFilter{MessageIDs: []string{msgs[1].UUID}}, 1},
		"published row": {store.DeadLetterFilter{MessageIDs: []string{msgs[2].UUID}}, 0},
		"seq":           {store.DeadLetterFilter{IDs: []int64{all[1].ID}}, 1},
	} {
		got, err := e.Store.OutboxDeadLetters(ctx, c.f)
		if err != nil || len(got) != c.want {
			t.Errorf("%s: %d rows (%v), want %d", name, len(got), err, c.want)
		}
	}
	replayed, err := e.Store.ReplayOutboxDeadLetters(ctx, store.DeadLetterFilter{ReasonContains: "refused b"})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay by error text = %v, %v", replayed, err)
	}
	if left, _ := e.Store.OutboxDeadLetters(ctx, store.DeadLetterFilter{}); len(left) != 1 || left[0].PartitionKey != "a" {
		t.Fatalf("after replaying b, dead letters = %+v", left)
	}
}

// A message the broker can never take (outboxkit.Permanent: too large, unroutable, a bad subject)
// is dead-lettered on its first failure, not backed off for MaxAttempts; its key's later rows and
// the other keys go on.
func permanentFailureDeadLettersAtOnce[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b"}, 3)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if m.UUID == msgs[0].UUID {
			return outboxkit.Permanent(errors.New("message too large for the broker"))
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 10 })
	res := dispatch(t, f)
	if res.DeadLettered != 1 || res.Failed != 1 {
		t.Fatalf("first pass = %+v, want the permanent failure dead-lettered at once", res)
	}
	drain(t, f, clk)
	letters, err := e.Store.OutboxDeadLetters(context.Background(), store.DeadLetterFilter{MessageIDs: []string{msgs[0].UUID}})
	if err != nil || len(letters) != 1 || letters[0].Attempts != 1 || !strings.Contains(letters[0].Reason, "too large") {
		t.Fatalf("dead letter = %+v (%v); want one attempt and the reason", letters, err)
	}
	if got := len(pub.accepted()); got != len(msgs)-1 {
		t.Fatalf("%d of the %d other rows published", got, len(msgs)-1)
	}
}

// A broker that refuses the relay's credentials is no outage that ends by itself, but no fault of
// the messages either: rows wait behind the open circuit with no attempt burned, Health says why,
// and a Run with a publisher that can check refuses to start.
func accessDeniedHoldsAndRefusesToStart[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 3)
	clk := newClock()
	pub := &checkingPublisher{fakePublisher: newFakePublisher()}
	refused := outboxkit.AccessDenied(errors.New("403 ACCESS_REFUSED: username or password not allowed"))
	pub.setFail(func(*message.Message, int) error { return outboxkit.Unreachable(refused) })
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	if res := dispatch(t, f); res.UnreachableErr == nil || res.Failed != 0 || res.DeadLettered != 0 {
		t.Fatalf("pass with refused credentials = %+v, want the rows held behind the circuit", res)
	}
	if hl := f.Health(); !hl.CircuitOpen || !outboxkit.IsAccessDenied(hl.Blocked) {
		t.Fatalf("health = %+v, want the circuit open and the refusal said", hl)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows had attempts burned by refused credentials", n)
	}
	pub.check = refused
	err := newForwarder(t, e.Store, pub, clk).Run(context.Background())
	if !outboxkit.IsAccessDenied(err) {
		t.Fatalf("Run with a broker that refuses the relay: %v, want it to refuse to start", err)
	}
}

// checkingPublisher is a fake publisher with a Check, as the backends' publishers have.
type checkingPublisher struct {
	*fakePublisher
	check error
}

func (p *checkingPublisher) Check(context.Context) error { return p.check }

// Run on tables never migrated refuses to start, naming the version to migrate to.
func runRefusesUnmigratedTables[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	err := newForwarder(t, e.Store, newFakePublisher(), newClock()).Run(context.Background())
	if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "needs version") {
		t.Fatalf("Run on unmigrated tables: %v, want ErrNotMigrated naming the version", err)
	}
}
