package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

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
