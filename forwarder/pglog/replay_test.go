package pglog_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// refusing is a broker that refuses the messages of key "bad" until told to accept them.
type refusing struct {
	*recorder
	refuse atomic.Bool
}

func (p *refusing) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.refuse.Load() && m.Metadata.Get(outboxkit.MetadataPartitionKey) == "bad" {
			return errors.New("message too large")
		}
	}
	return p.recorder.Publish(topic, msgs...)
}

// A replayed outbox dead letter reaches the broker through the log relay, in table mode (the row
// it dead-lettered; replayed by a console job) and in WAL mode (the row it wrote for the event of
// the log; replayed as outboxctl does), with its id; a second replay is a no-op.
func TestReplayedDeadLetterReachesTheBroker(t *testing.T) {
	t.Parallel()
	for _, mode := range []pglog.Mode{pglog.ModeTable, pglog.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			pub := &refusing{recorder: newRecorder()}
			pub.refuse.Store(true)
			r := relayOn(t, pg, pub, func(f *forwarder.Config, c *pglog.Config) { f.MaxAttempts = 2; c.Mode = mode })
			run(t, r)
			var id string
			if mode == pglog.ModeWAL {
				var err error
				if id, err = transact(walStore(t, pg), "bad"); err != nil {
					t.Fatal(err)
				}
			} else {
				id = write(t, pg, "bad", 1)[0]
			}
			testenv.Eventually(t, 10*time.Second, "the refused event dead-lettered", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`) == 1
			})
			pub.refuse.Store(false)
			ctx := context.Background()
			if mode == pglog.ModeTable {
				consoleReplay(t, pg)
			} else {
				letters, err := pg.Store.ReplayOutboxDeadLetters(ctx, store.DeadLetterFilter{MessageIDs: []string{id}})
				if err != nil || len(letters) != 1 {
					t.Fatalf("replay: %d letters, %v", len(letters), err)
				}
			}
			testenv.Eventually(t, 10*time.Second, "the replayed event published", func() bool { return pub.has([]string{id}) })
			testenv.Eventually(t, 10*time.Second, "its row removed once published", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0
			})
			if again, err := pg.Store.ReplayOutboxDeadLetters(ctx, store.DeadLetterFilter{MessageIDs: []string{id}}); err != nil || len(again) != 0 {
				t.Fatalf("a second replay: %d letters, %v; want none", len(again), err)
			}
			if n := pub.count(id); n != 1 {
				t.Errorf("the replayed event published %d times", n)
			}
		})
	}
}

// consoleReplay replays the outbox's dead letters as the console's job does.
func consoleReplay(t *testing.T, pg *testenv.PG) {
	t.Helper()
	consoleJob(t, pg, store.JobReplay)
}

// consoleJob runs a console job of kind on the outbox's dead letter.
func consoleJob(t *testing.T, pg *testenv.PG, kind string) {
	t.Helper()
	ctx := context.Background()
	con, _ := store.ConsoleOf(pg.Store)
	now := time.Now()
	if _, _, err := con.CreateJob(ctx, store.NewJob{Kind: kind, Filter: store.LetterQuery{Side: store.SideOutbox},
		RequestKey: kind, Rate: 100, Expected: 1, By: "test", Now: now}); err != nil {
		t.Fatal(err)
	}
	j, ok, err := con.ClaimJob(ctx, "console", now, time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim the replay job: %v, %v", ok, err)
	}
	step, err := con.StepOutboxJob(ctx, store.JobLease{ID: j.ID, Owner: "console", Token: j.LeaseToken}, 10, now)
	if err != nil || step.Applied != 1 {
		t.Fatalf("%s job: %+v, %v", kind, step, err)
	}
}
