package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

// runJob runs a job to its end with one lease, as a console's runner does.
func runJob(t *testing.T, c store.Console, id int64, owner string) store.Job {
	t.Helper()
	ctx := context.Background()
	j, ok, err := c.ClaimJob(ctx, owner, time.Now(), time.Minute)
	if err != nil || !ok || j.ID != id {
		t.Fatalf("claim job %d: %+v, %v, %v", id, j, ok, err)
	}
	l := store.JobLease{ID: j.ID, Owner: owner, Token: j.LeaseToken}
	for i := 0; i < 1000; i++ {
		var (
			step store.JobStep
			err  error
		)
		if j.Side == store.SideOutbox {
			step, err = c.StepOutboxJob(ctx, l, 3, time.Now())
		} else {
			var letters []store.DeadLetter
			letters, err = c.NextConsumerLetters(ctx, l, 3)
			if err == nil {
				step, err = c.CommitConsumerLetters(ctx, l, letters, nil, time.Now())
				step.Done = len(letters) < 3
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if step.Done {
			if err := c.FinishJob(ctx, l, store.JobDone, "", time.Now()); err != nil {
				t.Fatal(err)
			}
			j, err := c.Job(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return j
		}
	}
	t.Fatal("job did not end")
	return store.Job{}
}

func consoleArchive[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	// The key's head is dead-lettered and parks the rest of the key.
	msgs := write(t, e, []string{"k"}, 2)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error {
		if m.UUID == msgs[0].UUID {
			return errBroken
		}
		return nil
	})
	f := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.MaxAttempts = 1; c.ParkKeyOnDeadLetter = true })
	drain(t, f, clk)
	if n := len(pub.accepted()); n != 0 {
		t.Fatalf("%d rows overtook the dead-lettered head", n)
	}
	letters := everyPage(t, c, store.LetterQuery{Side: store.SideOutbox})
	if len(letters) != 1 {
		t.Fatalf("%d outbox letters, want 1", len(letters))
	}
	j, created, err := c.CreateJob(ctx, store.NewJob{Kind: store.JobArchive, Filter: store.LetterQuery{Side: store.SideOutbox, IDs: []int64{letters[0].ID}},
		RequestKey: "archive-1", Rate: 100, By: "alice", Now: time.Now()})
	if err != nil || !created || j.Total != 1 {
		t.Fatalf("create: %+v, %v, %v", j, created, err)
	}
	if j = runJob(t, c, j.ID, "console-a"); j.Applied != 1 || j.State != store.JobDone {
		t.Fatalf("archive job: %+v", j)
	}
	// Archived, the head parks its key no more, and waits no more.
	drain(t, f, clk)
	if got := pub.accepted(); len(got) != 1 || got[0].uuid != msgs[1].UUID {
		t.Fatalf("after archiving the head, published %v, want the key's second row", got)
	}
	if st, err := e.Store.OutboxStats(ctx, time.Now()); err != nil || st.DeadLettered != 0 {
		t.Fatalf("stats after archive: %+v, %v", st, err)
	}
	if got := everyPage(t, c, store.LetterQuery{Side: store.SideOutbox, Archived: true}); len(got) != 1 || got[0].ArchivedAt.IsZero() {
		t.Fatalf("archived list: %+v", got)
	}
	if _, err := f.ReplayOutboxDeadLetters(ctx, store.DeadLetterFilter{All: true}); err != nil {
		t.Fatal(err)
	}
	drain(t, f, clk)
	if n := len(pub.accepted()); n != 1 {
		t.Fatalf("an archived row was replayed: %d published", n)
	}

	// A consumer's letter: archived, it waits no more; dead-lettered again, it waits again.
	deadLetter(t, e, "billing", "m-1", "k", "OrderPlaced", 1, "boom", time.Now())
	j, _, err = c.CreateJob(ctx, store.NewJob{Kind: store.JobArchive, Filter: store.LetterQuery{Side: "billing"}, RequestKey: "archive-2",
		Rate: 100, By: "alice", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if j = runJob(t, c, j.ID, "console-a"); j.Applied != 1 {
		t.Fatalf("consumer archive job: %+v", j)
	}
	if w, err := e.Store.DeadLettersWaiting(ctx, "billing", time.Now()); err != nil || w.Count != 0 {
		t.Fatalf("waiting after archive: %+v, %v", w, err)
	}
	deadLetter(t, e, "billing", "m-1", "k", "OrderPlaced", 1, "boom again", time.Now())
	if w, err := e.Store.DeadLettersWaiting(ctx, "billing", time.Now()); err != nil || w.Count != 1 {
		t.Fatalf("dead-lettered again after archive: waiting %+v, %v; want it waiting again", w, err)
	}
}

func consoleOutboxJob[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	other := consoleOf(t, &Env[TTx]{Store: e.Another(t)})
	ctx := context.Background()
	clk, _ := deadOutbox(t, e, []string{"k-a", "k-b"}, 3)
	now := clk.Now() // the relay's clock dead-lettered them
	nj := store.NewJob{Kind: store.JobReplay, Filter: store.LetterQuery{Side: store.SideOutbox}, RequestKey: "form-1", Rate: 100,
		Expected: 6, By: "alice", Now: now}
	j, created, err := c.CreateJob(ctx, nj)
	if err != nil || !created || j.Total != 6 || j.State != store.JobQueued {
		t.Fatalf("create: %+v, %v, %v", j, created, err)
	}
	if again, created, err := c.CreateJob(ctx, nj); err != nil || created || again.ID != j.ID {
		t.Fatalf("the same form sent twice: job %d (created %v, %v), want job %d", again.ID, created, err, j.ID)
	}
	// A letter dead-lettered after the job was created is not in its selection.
	clk.Advance(time.Hour)
	deadOutbox(t, e, []string{"k-late"}, 1)

	a, ok, err := c.ClaimJob(ctx, "console-a", now, 30*time.Second)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	if _, ok, err := other.ClaimJob(ctx, "console-b", now, 30*time.Second); err != nil || ok {
		t.Fatalf("a second console claimed a job under lease: %v, %v", ok, err)
	}
	la := store.JobLease{ID: a.ID, Owner: "console-a", Token: a.LeaseToken}
	if step, err := c.StepOutboxJob(ctx, la, 4, now); err != nil || step.Applied != 4 || step.Done {
		t.Fatalf("first batch: %+v, %v", step, err)
	}
	// console-a stalls past its lease; console-b takes the job over.
	b, ok, err := other.ClaimJob(ctx, "console-b", now.Add(31*time.Second), 30*time.Second)
	if err != nil || !ok || b.CursorSeq == 0 {
		t.Fatalf("take-over: %+v, %v, %v", b, ok, err)
	}
	if _, err := c.StepOutboxJob(ctx, la, 4, now); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a stale lease wrote: %v, want ErrLeaseLost", err)
	}
	if _, err := c.RenewJob(ctx, la, now.Add(time.Hour), ""); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a stale lease renewed: %v, want ErrLeaseLost", err)
	}
	lb := store.JobLease{ID: b.ID, Owner: "console-b", Token: b.LeaseToken}
	for {
		step, err := other.StepOutboxJob(ctx, lb, 4, now)
		if err != nil {
			t.Fatal(err)
		}
		if step.Done {
			break
		}
	}
	if err := other.FinishJob(ctx, lb, store.JobDone, "", now); err != nil {
		t.Fatal(err)
	}
	done, err := c.Job(ctx, j.ID)
	if err != nil || done.Applied != 6 || done.Skipped != 0 || done.State != store.JobDone {
		t.Fatalf("finished job: %+v, %v", done, err)
	}
	// The replayed rows go out in each key's order; the late letter still waits.
	pub := newFakePublisher()
	drain(t, newForwarder(t, e.Store, pub, newClock()), clk)
	got := pub.accepted()
	if len(got) != 6 {
		t.Fatalf("%d replayed rows published, want 6", len(got))
	}
	assertPerKeyOrder(t, got)
	if n, _, err := c.CountDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox}, -1); err != nil || n != 1 {
		t.Fatalf("%d outbox letters wait after the job (%v), want the late one", n, err)
	}
}

func consoleConsumerJob[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	at := time.Now().Add(-time.Minute)
	for i, seq := range []int64{40, 10, 30, 0, 20} {
		deadLetter(t, e, "billing", fmt.Sprintf("m-%d", seq), "k", "OrderPlaced", seq, "boom", at.Add(time.Duration(i)*time.Millisecond))
	}
	deadLetter(t, e, "search", "m-x", "k", "OrderPlaced", 5, "boom", at)
	j, _, err := c.CreateJob(ctx, store.NewJob{Kind: store.JobReplay, Filter: store.LetterQuery{Side: "billing"}, RequestKey: "r",
		Rate: 10, By: "alice", Now: time.Now()})
	if err != nil || j.Total != 5 || j.Side != store.SideConsumers {
		t.Fatalf("create: %+v, %v", j, err)
	}
	claimed, ok, err := c.ClaimJob(ctx, "console-a", time.Now(), time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	l := store.JobLease{ID: j.ID, Owner: "console-a", Token: claimed.LeaseToken}
	if _, err := c.RenewJob(ctx, store.JobLease{ID: j.ID, Owner: "console-a", Token: claimed.LeaseToken + 1}, time.Now(), ""); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("renew with another token: %v, want ErrLeaseLost", err)
	}
	first, err := c.NextConsumerLetters(ctx, l, 2)
	if err != nil || len(first) != 2 || first[0].MessageID != "m-0" || first[1].MessageID != "m-10" || len(first[1].Payload) == 0 {
		t.Fatalf("first letters: %+v, %v; want m-0 then m-10, payloads included", first, err)
	}
	if _, err := c.CommitConsumerLetters(ctx, l, first, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	// m-30 is replayed by someone else meanwhile: the job skips it.
	rest, err := c.NextConsumerLetters(ctx, l, 10)
	if err != nil || len(rest) != 3 || rest[0].MessageID != "m-20" {
		t.Fatalf("rest: %+v, %v", rest, err)
	}
	if err := e.Store.MarkReplayed(ctx, rest[1].ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	step, err := c.CommitConsumerLetters(ctx, l, rest[:2], rest[2:], time.Now())
	if err != nil || step.Applied != 1 || step.Skipped != 1 {
		t.Fatalf("commit: %+v, %v", step, err)
	}
	if more, err := c.NextConsumerLetters(ctx, l, 10); err != nil || len(more) != 0 {
		t.Fatalf("after the last: %+v, %v", more, err)
	}
	if err := c.FinishJob(ctx, l, store.JobDone, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	done, _ := c.Job(ctx, j.ID)
	if done.Applied != 3 || done.Skipped != 1 || done.Failed != 1 {
		t.Fatalf("job: applied %d, skipped %d, failed %d; want 3, 1, 1", done.Applied, done.Skipped, done.Failed)
	}
	if w, _ := e.Store.DeadLettersWaiting(ctx, "search", time.Now()); w.Count != 1 {
		t.Fatalf("search's letter (outside the selection) waits %d, want 1", w.Count)
	}
	if ok, err := c.RequestCancel(ctx, j.ID, "bob", time.Now()); err != nil || ok {
		t.Fatalf("cancel of a finished job: %v, %v; want false", ok, err)
	}
	queued, _, err := c.CreateJob(ctx, store.NewJob{Kind: store.JobReplay, Filter: store.LetterQuery{Side: "search"}, RequestKey: "q",
		Rate: 10, By: "alice", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.RequestCancel(ctx, queued.ID, "bob", time.Now()); err != nil || !ok {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	if got, _ := c.Job(ctx, queued.ID); got.State != store.JobCancelled || got.CancelBy != "bob" {
		t.Fatalf("a queued job cancelled: %+v", got)
	}
}
