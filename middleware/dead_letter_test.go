package middleware_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// The crash loop itself, the attempt alone and a single wait past SoloWait are tested against
// every database by the store conformance suite (store/storetest). These tests bound the waits.

// migratedSQLite is a migrated SQLite store of the test's own.
func migratedSQLite(t *testing.T) *sqlitestore.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.DB().Close() })
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	return st
}

// countAndDeadLetter is the part of the stack a suspect meets: DeliveryCount, then DeadLetter.
func countAndDeadLetter(t *testing.T, cfg middleware.DeadLetterConfig, h message.NoPublishHandlerFunc) message.HandlerFunc {
	t.Helper()
	count, err := middleware.NewDeliveryCount(middleware.DeliveryCountConfig{Store: cfg.Store, Consumer: cfg.Consumer})
	if err != nil {
		t.Fatal(err)
	}
	deadLetter, err := middleware.NewDeadLetter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return count(deadLetter(func(m *message.Message) ([]*message.Message, error) { return nil, h(m) }))
}

// busy runs a delivery of another consumer that stays in its handler until the returned function
// is called, which waits for it to end: while it runs, no suspect of the process can run alone.
func busy(t *testing.T, st store.Store) (end func()) {
	t.Helper()
	deadLetter, err := middleware.NewDeadLetter(middleware.DeadLetterConfig{Store: st, Consumer: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	started, finish, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := deadLetter(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-finish
			return nil, nil
		})(message.NewMessage(testMessageID(t, "long"), nil))
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the long delivery ended before its handler ran: %v", err)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			close(finish)
			if err := <-done; err != nil {
				t.Errorf("the long delivery: %v", err)
			}
		})
	}
	t.Cleanup(end)
	return end
}

func testMessageID(t *testing.T, what string) string {
	return what + "-" + strings.ReplaceAll(t.Name(), "/", "-")
}

// redelivery is a fresh copy of msg that the broker says was delivered before: DeliveryCount
// counts it as the second delivery at least, so with MaxDeliveries 1 every delivery is a suspect.
func redelivery(msg *message.Message) *message.Message {
	c := message.NewMessage(msg.UUID, msg.Payload)
	c.SetContext(outboxkit.WithRedelivered(context.Background(), true))
	return c
}

func soloWaitRows(t *testing.T, st *sqlitestore.Store) int {
	t.Helper()
	var n int
	if err := st.DB().QueryRow(`SELECT count(*) FROM inbox_deliveries WHERE message_id LIKE 'solowait:%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type capturePublisher struct {
	mu   sync.Mutex
	sent []*message.Message
}

func (p *capturePublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, msgs...)
	return nil
}

func (p *capturePublisher) Close() error { return nil }

// A suspect whose process is never free of other deliveries for SoloWait can never run alone. It
// is not retried forever — each wait holding back the process's new deliveries for SoloWait — but
// dead-lettered on the delivery on which it waits in vain for the MaxSoloWaits-th time, with a
// reason that says it never got to run alone. Its handler never ran; a replay hands it over again,
// with a fresh count, like any dead letter.
func TestDeadLetter_SuspectThatNeverRunsAloneIsDeadLetteredAfterMaxSoloWaits(t *testing.T) {
	for _, tc := range []struct {
		name         string
		maxSoloWaits int // 0: the default
		want         int
	}{{"default", 0, middleware.DefaultMaxSoloWaits}, {"configured", 2, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			st := migratedSQLite(t)
			var runs atomic.Int32
			stack := countAndDeadLetter(t, middleware.DeadLetterConfig{Store: st, Consumer: "billing",
				MaxDeliveries: 1, SoloWait: 20 * time.Millisecond, MaxSoloWaits: tc.maxSoloWaits},
				func(*message.Message) error { runs.Add(1); return nil })
			end := busy(t, st)
			suspect := message.NewMessage(testMessageID(t, "suspect"), []byte(`{"id":"o-1"}`))
			for n := 1; n < tc.want; n++ {
				_, err := stack(redelivery(suspect))
				if err == nil || !strings.Contains(err.Error(), "other deliveries still ran after 20ms") {
					t.Fatalf("wait %d: the suspect's delivery returned %v; want it to fail, not run", n, err)
				}
				if letters, err := st.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "billing"}); err != nil || len(letters) != 0 {
					t.Fatalf("wait %d of %d: dead letters %+v (%v), want none yet", n, tc.want, letters, err)
				}
			}
			if _, err := stack(redelivery(suspect)); err != nil {
				t.Fatalf("wait %d of %d: the suspect's delivery returned %v; want it dead-lettered and acknowledged", tc.want, tc.want, err)
			}
			if n := runs.Load(); n != 0 {
				t.Fatalf("the suspect's handler ran %d times beside the long delivery", n)
			}
			letters, err := st.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			if len(letters) != 1 || letters[0].MessageID != suspect.UUID || letters[0].Attempts != tc.want+1 ||
				!strings.Contains(letters[0].Reason, "never got to run alone") {
				t.Fatalf("dead letters %+v; want the suspect's, after %d deliveries, saying it never got to run alone", letters, tc.want+1)
			}
			if n := soloWaitRows(t, st); n != 0 {
				t.Fatalf("%d counts of waits to run alone left behind", n)
			}
			end()

			pub := &capturePublisher{}
			if _, err := middleware.ReplayInboxDeadLetters(context.Background(), middleware.ReplayConfig{Store: st, Publisher: pub},
				store.DeadLetterFilter{Consumer: "billing"}); err != nil || len(pub.sent) != 1 {
				t.Fatalf("replay sent %d messages (%v), want the suspect", len(pub.sent), err)
			}
			if _, err := stack(redelivery(pub.sent[0])); err != nil {
				t.Fatalf("the replayed suspect: %v", err)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the replayed suspect's handler ran %d times, want once", n)
			}
		})
	}
}

// The waits that count are those in a row: a suspect that got its attempt alone at last, and came
// back from it unfinished but not at fault (a dependency it could not reach), starts counting anew.
func TestDeadLetter_AnAttemptAloneStartsTheWaitsAnew(t *testing.T) {
	st := migratedSQLite(t)
	unreachable := outboxkit.Unreachable(errors.New("payments API down"))
	var runs atomic.Int32
	stack := countAndDeadLetter(t, middleware.DeadLetterConfig{Store: st, Consumer: "billing",
		MaxDeliveries: 1, SoloWait: 20 * time.Millisecond, MaxSoloWaits: 2},
		func(*message.Message) error { runs.Add(1); return unreachable })
	suspect := message.NewMessage(testMessageID(t, "suspect"), []byte(`{"id":"o-1"}`))
	deadLetters := func() int {
		letters, err := st.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		return len(letters)
	}

	end := busy(t, st)
	if _, err := stack(redelivery(suspect)); err == nil || runs.Load() != 0 {
		t.Fatalf("wait 1 of 2: the suspect's delivery returned %v and ran %d times; want it to fail, not run", err, runs.Load())
	}
	end()
	if _, err := stack(redelivery(suspect)); !errors.Is(err, unreachable) || runs.Load() != 1 {
		t.Fatalf("the attempt alone returned %v, %d runs; want the dependency's error, once", err, runs.Load())
	}
	if n := soloWaitRows(t, st); n != 0 {
		t.Fatalf("%d counts of waits to run alone kept after the attempt alone", n)
	}
	end = busy(t, st)
	if _, err := stack(redelivery(suspect)); err == nil || deadLetters() != 0 {
		t.Fatalf("wait 1 of 2 after the attempt alone: the delivery returned %v with %d dead letters; want it to fail, "+
			"not dead-lettered: the wait before the attempt alone no longer counts", err, deadLetters())
	}
	if _, err := stack(redelivery(suspect)); err != nil || deadLetters() != 1 {
		t.Fatalf("wait 2 of 2: the delivery returned %v with %d dead letters; want the suspect dead-lettered", err, deadLetters())
	}
	end()
	if runs.Load() != 1 {
		t.Fatalf("the suspect's handler ran %d times, want once (its attempt alone)", runs.Load())
	}
}

func TestDeadLetterConfig_RefusesNegativeMaxSoloWaits(t *testing.T) {
	_, err := middleware.NewDeadLetter(middleware.DeadLetterConfig{Store: migratedSQLite(t), Consumer: "billing", MaxSoloWaits: -1})
	if err == nil || !strings.Contains(err.Error(), "field MaxSoloWaits must be at least 1, got -1") {
		t.Fatalf("NewDeadLetter = %v; want it to refuse MaxSoloWaits -1", err)
	}
}
