package forwarder_test

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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// Failure matrix, "crash after commit, before publish": the writer committed, and the relay that
// claimed the rows died before publishing any. The rows stay pending, their locks die with the
// relay's transaction, and the restarted relay publishes each exactly once.
func TestDispatch_CrashAfterCommitBeforePublish(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"a", "b"}, 3)

	pub := newFakePublisher()
	clk := newClock()
	dying := newForwarder(t, pg, pub, clk)
	crash := errors.New("relay died after claiming, before publishing")
	forwarder.SetBeforePublishHook(dying, func() error { return crash })
	if _, err := dying.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := len(pub.timesSent()); n != 0 {
		t.Fatalf("%d messages published by the relay that died before publishing", n)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}
	res := dispatch(t, newForwarder(t, pg, pub, clk))
	if res.Claimed != 6 || res.Published != 6 {
		t.Fatalf("result = %+v, want 6 claimed and published", res)
	}
	sentCount := pub.timesSent()
	for _, m := range msgs {
		if sentCount[m.UUID] != 1 {
			t.Errorf("message %s published %d times, want 1", m.UUID, sentCount[m.UUID])
		}
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

func TestDispatch_MessageCarriesIdentityAndOrigin(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"order-1"}, 1)
	var got *message.Message
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error { got = m; return nil })
	dispatch(t, newForwarder(t, pg, pub, newClock(), func(c *forwarder.Config) {
		c.TopicMapping = func(topic, key string) string { return "prod." + topic + "." + key }
	}))
	if got == nil || got.UUID != msgs[0].UUID || string(got.Payload) != string(msgs[0].Payload) {
		t.Fatalf("published %+v, want the outbox message %s", got, msgs[0].UUID)
	}
	if outboxkit.PartitionKey(got) != "order-1" || outboxkit.EventType(got) != "Happened" {
		t.Errorf("metadata lost: %v", got.Metadata)
	}
	if created, ok := outboxkit.CreatedAt(got); !ok || time.Since(created) > time.Minute {
		t.Errorf("created_at stamp = %q", got.Metadata.Get(outboxkit.MetadataCreatedAt))
	}
	if s := pub.accepted(); s[0].topic != "prod.events.order-1" {
		t.Errorf("topic = %q, want the mapped prod.events.order-1", s[0].topic)
	}
}

func TestDispatch_FailureBacksOffThenSucceeds(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"k"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(_ *message.Message, call int) error {
		if call == 1 {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk) // backoff: 1s after the first failure, no jitter

	if res := dispatch(t, f); res.Failed != 1 || res.Published != 0 {
		t.Fatalf("first pass = %+v, want one failure", res)
	}
	var attempts int
	var lastErr string
	if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(
		`SELECT attempts, last_error FROM {{schema}}.outbox WHERE uuid = $1`), msgs[0].UUID).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || !strings.Contains(lastErr, errBroken.Error()) {
		t.Fatalf("attempts = %d, last_error = %q; want 1 and the publisher's error", attempts, lastErr)
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

func TestDispatch_DeadLetterThenReplay(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"k"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	broken := true
	pub.setFail(func(*message.Message, int) error {
		if broken {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 3 })

	dead := 0
	for i := 0; i < 100; i++ {
		res := dispatch(t, f)
		dead += res.DeadLettered
		clk.Advance(time.Hour)
	}
	if dead != 1 {
		t.Fatalf("dead-lettered %d times, want once", dead)
	}
	var attempts int
	var deadAt *time.Time
	_ = pg.Pool.QueryRow(context.Background(), pg.Schema.Render(
		`SELECT attempts, dead_lettered_at FROM {{schema}}.outbox`)).Scan(&attempts, &deadAt)
	if attempts != 3 || deadAt == nil {
		t.Fatalf("attempts = %d, dead_lettered_at = %v; want 3 and set", attempts, deadAt)
	}
	if s, _ := f.Stats(context.Background()); s.DeadLettered != 1 || s.Pending != 0 {
		t.Fatalf("stats = %+v", s)
	}

	broken = false
	for i := 0; i < 5; i++ {
		dispatch(t, f)
		clk.Advance(time.Hour)
	}
	if n := len(pub.accepted()); n != 0 {
		t.Fatalf("a dead-lettered row was published %d times before replay", n)
	}

	if _, err := f.ReplayDeadLetters(context.Background(), forwarder.DeadLetterFilter{}); err == nil {
		t.Fatal("an empty filter replayed; it must demand a selection or All")
	}
	seqs, err := f.ReplayDeadLetters(context.Background(), forwarder.DeadLetterFilter{UUIDs: []string{msgs[0].UUID}})
	if err != nil || len(seqs) != 1 {
		t.Fatalf("replay = %v, %v", seqs, err)
	}
	drain(t, f, clk)
	if got := pub.timesSent()[msgs[0].UUID]; got != 1 {
		t.Fatalf("replayed row published %d times, want exactly once", got)
	}
}

func TestDispatch_CrashAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"a", "b", "c"}, 2)
	clk := newClock()
	pub := newFakePublisher()
	f := newForwarder(t, pg, pub, clk)
	crash := errors.New("process died between publish and mark")
	forwarder.SetAfterPublishHook(f, func() error { return crash })
	if _, err := f.DispatchBatch(context.Background()); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the injected crash", err)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != len(msgs) {
		t.Fatalf("%d rows pending after the crash, want all %d", n, len(msgs))
	}

	restarted := newForwarder(t, pg, pub, clk)
	drain(t, restarted, clk)
	counts := pub.timesSent()
	for _, m := range msgs {
		if counts[m.UUID] != 2 {
			t.Errorf("message %s published %d times, want 2 (a duplicate, never a loss)", m.UUID, counts[m.UUID])
		}
	}
}

func TestDispatch_TwoForwardersAtOnce(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	msgs := write(t, pg, keys, 50)
	clk := newClock()
	pub := newFakePublisher() // shared: its log is the broker's view of both relays

	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		pool, err := pgxpool.New(context.Background(), pg.URL) // a separate relay process, as far as Postgres can tell
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) {
			c.Pool = pool
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
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != 0 {
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

func TestDispatch_PerKeyOrderWithRandomFailures(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	msgs := write(t, pg, keys, 200)
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
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) {
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

func TestDispatch_FailingKeyDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	write(t, pg, []string{"stuck", "a", "b", "c"}, 25)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "stuck" {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk)
	res := dispatch(t, f)
	if res.Published != 75 || res.Failed != 1 {
		t.Fatalf("first pass = %+v; want the 75 rows of healthy keys published and 1 failure", res)
	}
	for _, s := range pub.accepted() {
		if s.key == "stuck" {
			t.Fatalf("a row of the failing key was published past its failed head")
		}
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL AND partition_key = 'stuck'`); n != 25 {
		t.Fatalf("stuck key has %d pending rows, want 25", n)
	}
}

func TestDispatch_ParkKeyOnDeadLetter(t *testing.T) {
	t.Parallel()
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park=%v", park), func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			msgs := write(t, pg, []string{"k"}, 3)
			clk := newClock()
			pub := newFakePublisher()
			pub.setFail(func(m *message.Message, _ int) error {
				if m.UUID == msgs[0].UUID {
					return errBroken
				}
				return nil
			})
			f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) {
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
				if _, err := f.ReplayDeadLetters(context.Background(), forwarder.DeadLetterFilter{PartitionKey: "k"}); err != nil {
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
func TestDispatch_ReplayedHeadWaitsForNothingButBackingOffRowsStillBlock(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"k"}, 3)
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
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	dispatch(t, f) // row 1 dead-lettered at once
	mu.Lock()
	failing = map[string]bool{msgs[1].UUID: true}
	mu.Unlock()
	f2 := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 5 })
	dispatch(t, f2) // row 2 fails once: backing off for a second
	if _, err := f2.ReplayDeadLetters(context.Background(), forwarder.DeadLetterFilter{Seqs: []int64{1}}); err != nil {
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

func TestDispatch_BrokerOutageOpensCircuitWithoutBurningAttempts(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	write(t, pg, []string{"a", "b", "c", "d"}, 10)
	clk := newClock()
	pub := newFakePublisher()
	down := true
	pub.setFail(func(*message.Message, int) error {
		if down {
			return outboxkit.Transport(errors.New("dial tcp: connection refused"))
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 2 })

	res := dispatch(t, f)
	if res.TransportErr == nil || res.Failed != 0 {
		t.Fatalf("pass during outage = %+v, want a transport error and no counted failure", res)
	}
	res = dispatch(t, f)
	if !res.CircuitOpen || res.Claimed != 0 {
		t.Fatalf("pass with the circuit open = %+v, want it to do nothing", res)
	}
	for i := 0; i < 50; i++ { // a long outage: many probes, each failing
		clk.Advance(time.Minute)
		dispatch(t, f)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows had attempts burned by the outage", n)
	}
	down = false
	clk.Advance(time.Minute)
	if res := dispatch(t, f); res.Published != 1 {
		t.Fatalf("probe pass = %+v, want one row published", res)
	}
	drain(t, f, clk)
	if got := len(pub.accepted()); got != 40 {
		t.Fatalf("after the outage %d of 40 published", got)
	}
}

func TestDispatch_MalformedRowIsQuarantinedNotBlocking(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pg.Exec(t, `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata)
	            VALUES ('bad-1', 'events', 'k', '', '{"n": 1}')`)
	good := write(t, pg, []string{"other"}, 3)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if m.UUID == good[0].UUID {
			panic("publisher bug")
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 2 })
	drain(t, f, clk)
	var lastErr string
	_ = pg.Pool.QueryRow(context.Background(), pg.Schema.Render(
		`SELECT last_error FROM {{schema}}.outbox WHERE uuid = 'bad-1' AND dead_lettered_at IS NOT NULL`)).Scan(&lastErr)
	if !strings.Contains(lastErr, "metadata is not a JSON object of strings") {
		t.Fatalf("malformed row last_error = %q; want it dead-lettered with the reason", lastErr)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d dead letters, want the malformed row and the one that panicked", n)
	}
	if got := len(pub.accepted()); got != 2 {
		t.Fatalf("%d good rows published, want 2", got)
	}
}

func TestPrunePublished(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	write(t, pg, []string{"a"}, 30)
	clk := newClock()
	f := newForwarder(t, pg, newFakePublisher(), clk, func(c *forwarder.Config) {
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
	if left := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); left != 10 {
		t.Fatalf("%d pending rows left, want 10 untouched", left)
	}
}

func TestDeleteOnPublish(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	write(t, pg, []string{"a"}, 5)
	f := newForwarder(t, pg, newFakePublisher(), newClock(), func(c *forwarder.Config) {
		c.Retention.DeleteOnPublish = true
	})
	if res := dispatch(t, f); res.Published != 5 {
		t.Fatalf("result = %+v", res)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("%d rows left; DeleteOnPublish keeps nothing", n)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	write(t, pg, []string{"a", "b"}, 2)
	clk := newClock()
	clk.Advance(90 * time.Second)
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "a" {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	s, err := f.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending != 4 || s.OldestPendingAge < 90*time.Second || s.OldestPendingAge > 5*time.Minute || s.DeadLettered != 0 {
		t.Fatalf("stats before = %+v", s)
	}
	dispatch(t, f) // a's head dead-lettered, b published
	clk.Advance(time.Minute)
	s, _ = f.Stats(context.Background())
	if s.Pending != 1 || s.DeadLettered != 1 || s.OldestDeadLettered.Round(time.Millisecond) != time.Minute {
		t.Fatalf("stats after = %+v; want 1 pending (a's second row), 1 dead letter a minute old", s)
	}
}

func TestConfigValidation(t *testing.T) {
	_, err := forwarder.New(forwarder.Config{})
	for _, want := range []string{"Pool is required", "Publisher is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero config: got %v, want it to say %q", err, want)
		}
	}
	pool := &pgxpool.Pool{}
	cases := map[string]forwarder.Config{
		"BatchSize must be at least 1":          {BatchSize: -1},
		"Backoff.Multiplier must be at least 1": {Backoff: forwarder.Backoff{Initial: 1, Max: 2, Multiplier: 0.5}},
		"Backoff.Max":                           {Backoff: forwarder.Backoff{Initial: 2, Max: 1, Multiplier: 2}},
		"Jitter must be in [0, 1)":              {CircuitBackoff: forwarder.Backoff{Initial: 1, Max: 2, Multiplier: 2, Jitter: 1}},
		"contradict":                            {Retention: forwarder.Retention{Keep: true, DeleteOnPublish: true}},
		"Schema":                                {Schema: "Bad-Name"},
		"PollInterval must be positive":         {PollInterval: -time.Second},
	}
	for want, cfg := range cases {
		cfg.Pool, cfg.Publisher = pool, newFakePublisher()
		if _, err := forwarder.New(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error mentioning %q", err, want)
		}
	}
}

// A key whose head must wait and whose backlog is longer than the claim window must not starve
// the keys written after it: the window skips the stuck key instead of filling up with it.
func TestDispatch_StuckKeyWithLongBacklogDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"backing off", "parked behind a dead letter"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			write(t, pg, []string{"stuck"}, 100) // oldest rows: all of one key
			write(t, pg, []string{"a", "b", "c"}, 10)
			pub := newFakePublisher()
			pub.setFail(func(m *message.Message, _ int) error {
				if outboxkit.PartitionKey(m) == "stuck" {
					return errBroken
				}
				return nil
			})
			f := newForwarder(t, pg, pub, newClock(), func(c *forwarder.Config) {
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
			res := dispatch(t, f)
			if res.Published != 20 {
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
func TestDispatch_RowLockedElsewhereHoldsBackTheRestOfItsKey(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"k"}, 4) // seqs 1..4
	write(t, pg, []string{"other"}, 2)
	ctx := context.Background()
	other, err := pg.Pool.Begin(ctx) // "another relay"
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, pg.Schema.Render(`SELECT 1 FROM {{schema}}.outbox WHERE seq = 2 FOR UPDATE`)); err != nil {
		t.Fatal(err)
	}

	pub := newFakePublisher()
	res := dispatch(t, newForwarder(t, pg, pub, newClock()))
	got := map[string]bool{}
	for _, s := range pub.accepted() {
		got[s.uuid] = true
	}
	if !got[msgs[0].UUID] || got[msgs[2].UUID] || got[msgs[3].UUID] || res.Published != 3 {
		t.Fatalf("pass = %+v; want row 1 of k and both rows of other published, rows 3 and 4 of k held back behind the locked row 2", res)
	}
}

func TestOutbox_DeadLetterListingAndFilters(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msgs := write(t, pg, []string{"a", "b", "c"}, 1)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if outboxkit.PartitionKey(m) == "c" {
			return nil
		}
		return fmt.Errorf("refused %s", outboxkit.PartitionKey(m))
	})
	f := newForwarder(t, pg, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1 })
	dispatch(t, f)
	ob, err := forwarder.NewOutbox(pg.Pool, forwarder.OutboxConfig{Schema: string(pg.Schema), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	all, err := ob.DeadLetters(ctx, forwarder.DeadLetterFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("listing = %d rows, %v; want the 2 dead letters", len(all), err)
	}
	if all[0].UUID != msgs[0].UUID || all[0].LastError != "refused a" || all[0].PartitionKey != "a" ||
		all[0].Attempts != 1 || all[0].Metadata[outboxkit.MetadataEventType] != "Happened" {
		t.Fatalf("first dead letter = %+v", all[0])
	}
	for name, c := range map[string]struct {
		f    forwarder.DeadLetterFilter
		want int
	}{
		"error text":    {forwarder.DeadLetterFilter{ErrorContains: "refused b"}, 1},
		"key":           {forwarder.DeadLetterFilter{PartitionKey: "a"}, 1},
		"topic":         {forwarder.DeadLetterFilter{Topic: "events"}, 2},
		"other topic":   {forwarder.DeadLetterFilter{Topic: "nope"}, 0},
		"since later":   {forwarder.DeadLetterFilter{From: clk.Now().Add(time.Minute)}, 0},
		"until later":   {forwarder.DeadLetterFilter{Until: clk.Now().Add(time.Minute)}, 2},
		"uuid":          {forwarder.DeadLetterFilter{UUIDs: []string{msgs[1].UUID}}, 1},
		"published row": {forwarder.DeadLetterFilter{UUIDs: []string{msgs[2].UUID}}, 0},
	} {
		got, err := ob.DeadLetters(ctx, c.f)
		if err != nil || len(got) != c.want {
			t.Errorf("%s: %d rows (%v), want %d", name, len(got), err, c.want)
		}
	}
	seqs, err := ob.ReplayDeadLetters(ctx, forwarder.DeadLetterFilter{ErrorContains: "refused b"})
	if err != nil || len(seqs) != 1 {
		t.Fatalf("replay by error text = %v, %v", seqs, err)
	}
	if left, _ := ob.DeadLetters(ctx, forwarder.DeadLetterFilter{}); len(left) != 1 || left[0].PartitionKey != "a" {
		t.Fatalf("after replaying b, dead letters = %+v", left)
	}
}
