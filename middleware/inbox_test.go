package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
)

// The effect's write fails once: after the failure there is no effect and no inbox row; the retry
// succeeds; in the end there is exactly one of each.
func TestInbox_FailedEffectLeavesNothingAndTheRetrySucceeds(t *testing.T) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			msg := orderMsg("o-1")
			var attempts atomic.Int32
			var afterFailure [2]int
			h := handlers.JSON(func(ctx context.Context, tx pgx.Tx, o order) error {
				n := attempts.Add(1)
				if n == 2 { // look from outside the transaction at what the failed attempt left
					afterFailure[0] = e.count(t, "effects", "shipping", msg.UUID)
					afterFailure[1] = e.count(t, "inbox", "shipping", msg.UUID)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO effects (consumer, message_id, note) VALUES ('shipping', $1, $2)`, msg.UUID, o.ID); err != nil {
					return err
				}
				if n == 1 {
					_, err := tx.Exec(ctx, `SELECT 1/0`) // the effect's second write fails
					return err
				}
				return nil
			})
			stack := e.stack(t, "shipping", h, func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable })
			if _, err := stack(delivery(msg)); err != nil {
				t.Fatalf("delivery failed: %v (the in-process retry should have succeeded)", err)
			}
			if attempts.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2 (one failure, one retry)", attempts.Load())
			}
			if afterFailure != [2]int{0, 0} {
				t.Fatalf("after the failed attempt: %d effects and %d inbox rows, want none", afterFailure[0], afterFailure[1])
			}
			if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
				t.Fatalf("in the end: %d effects and %d inbox rows, want one of each", got[0], got[1])
			}
		})
	}
}

// One message delivered 50 times at once: one effect, one inbox row, 49 duplicates.
//
// It holds a database session per delivery, so it runs alone: not in parallel with the package's
// other tests, its two cases one after the other; and it takes no more sessions than the shared
// server can spare beside the other packages' tests (at least 20 deliveries at once).
func TestInbox_FiftyConcurrentDeliveries(t *testing.T) {
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			e := newEnv(t)
			cfg, err := pgxpool.ParseConfig(e.pg.URL)
			if err != nil {
				t.Fatal(err)
			}
			n := e.pg.Sessions(t, 52, 22) - 2
			cfg.MaxConns = int32(n + 2)
			app := testenv.UniqueName(t, "inbox")
			cfg.ConnConfig.RuntimeParams["application_name"] = app
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			msg := orderMsg("o-1")
			var runs atomic.Int32
			h := func(m *message.Message) error {
				runs.Add(1)
				// Hold the first delivery open until the others are queued behind it, so the
				// deliveries really overlap.
				if !waitFor(20*time.Second, func() bool {
					return e.pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
					                    AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_lock%'`, app) >= n-1
				}) {
					return errors.New("the other deliveries never queued behind the first one")
				}
				return effect("shipping")(m)
			}
			stack := e.stack(t, "shipping", h, withPool(pool), func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable })
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := stack(delivery(msg)); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("a delivery failed: %v", err)
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want once", runs.Load())
			}
			if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
				t.Fatalf("%d effects and %d inbox rows, want one of each", got[0], got[1])
			}
			if d := e.outcome(t, "shipping", "duplicate"); d != n-1 {
				t.Fatalf("%d duplicates counted, want %d", d, n-1)
			}
		})
	}
}

// Two consumers of the same message each process it once, each with its own inbox row.
func TestInbox_TwoConsumersEachProcessOnce(t *testing.T) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			msg := orderMsg("o-1")
			tune := func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable }
			shipping := e.stack(t, "shipping", effect("shipping"), tune)
			billing := e.stack(t, "billing", effect("billing"), tune)
			for i := 0; i < 3; i++ { // each consumer gets the message three times
				for _, s := range []message.HandlerFunc{shipping, billing} {
					if _, err := s(delivery(msg)); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, c := range []string{"shipping", "billing"} {
				if got := [2]int{e.count(t, "effects", c, msg.UUID), e.count(t, "inbox", c, msg.UUID)}; got != [2]int{1, 1} {
					t.Fatalf("%s: %d effects and %d inbox rows, want one of each", c, got[0], got[1])
				}
				if d := e.outcome(t, c, "duplicate"); d != 2 {
					t.Fatalf("%s: %d duplicates, want 2", c, d)
				}
			}
		})
	}
}

// A message written longer ago than the inbox retention, with no inbox row, may be a redelivery
// whose row was pruned: it is quarantined, not processed as new.
func TestInbox_OlderThanRetentionIsQuarantinedAsPossibleDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	msg := orderMsg("o-1")
	msg.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-8*24*time.Hour).Format(time.RFC3339Nano))
	stack := e.stack(t, "shipping", effect("shipping"))
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatalf("quarantine should acknowledge: %v", err)
	}
	if e.count(t, "effects", "shipping", msg.UUID) != 0 || e.count(t, "inbox", "shipping", msg.UUID) != 0 {
		t.Fatal("an old message without an inbox row was processed as new")
	}
	letters, err := middleware.ListDeadLetters(context.Background(), e.pg.Pool, string(e.pg.Schema), middleware.DeadLetterFilter{All: true})
	if err != nil || len(letters) != 1 || !strings.Contains(letters[0].Reason, "possible duplicate") {
		t.Fatalf("dead letters = %+v, %v; want one possible duplicate", letters, err)
	}
	fresh := orderMsg("o-2")
	fresh.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-time.Hour).Format(time.RFC3339Nano))
	if _, err := stack(delivery(fresh)); err != nil || e.count(t, "effects", "shipping", fresh.UUID) != 1 {
		t.Fatalf("a message within the retention was not processed: %v", err)
	}
}

func TestPruneInbox_RemovesOnlyRowsOlderThanTheCutoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	now := time.Now()
	e.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	stack := e.stack(t, "shipping", effect("shipping"))
	var old, recent []string
	for i := 0; i < 25; i++ {
		m := orderMsg("old")
		old = append(old, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(48 * time.Hour)
	for i := 0; i < 5; i++ {
		m := orderMsg("recent")
		recent = append(recent, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(time.Hour)
	n, err := middleware.PruneInbox(context.Background(), middleware.PruneConfig{
		Pool: e.pg.Pool, Schema: string(e.pg.Schema), BatchSize: 7, Now: e.now,
	}, 24*time.Hour)
	if err != nil || n != 25 {
		t.Fatalf("pruned %d rows (%v), want the 25 older than a day", n, err)
	}
	for _, id := range recent {
		if e.count(t, "inbox", "shipping", id) != 1 {
			t.Fatalf("recent inbox row %s was pruned", id)
		}
	}
	for _, id := range old {
		if e.count(t, "inbox", "shipping", id) != 0 {
			t.Fatalf("old inbox row %s survived", id)
		}
	}
}

// waitFor polls cond until it holds or within passes; it is for goroutines other than the test's.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

func TestStats_CountsProcessedDuplicatesAndDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stack := e.stack(t, "shipping", effect("shipping"))
	a, b := orderMsg("a"), orderMsg("b")
	for _, m := range []*message.Message{a, a, a, b, message.NewMessage("bad", []byte("not json"))} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	stats, err := middleware.Stats(context.Background(), e.pg.Pool, string(e.pg.Schema))
	if err != nil {
		t.Fatal(err)
	}
	want := []middleware.ConsumerStats{{Consumer: "shipping", Processed: 2, Duplicates: 2, DeadLetters: 1}}
	if len(stats) != 1 || stats[0] != want[0] {
		t.Fatalf("stats = %+v, want %+v", stats, want)
	}
}
