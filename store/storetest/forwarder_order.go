package storetest

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
)

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
