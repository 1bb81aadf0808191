package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

func consoleTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"ListsPageEveryLetterOnceAndGroupThem", consoleListing[TTx]},
		{"BoundedScansStopAndResume", consoleBoundedScan[TTx]},
		{"ArchiveStopsWaitingAndUnparksTheKey", consoleArchive[TTx]},
		{"PauseHoldsATopicAndARelay", consolePause[TTx]},
		{"PauseIsHonouredWithinAPass", consolePauseWithinAPass[TTx]},
		{"OutboxJobReplaysInKeyOrderUnderALease", consoleOutboxJob[TTx]},
		{"ConsumerJobInSourceOrderFencedByTheLease", consoleConsumerJob[TTx]},
		{"RegroupFillsLettersStoredWithoutAGroup", consoleRegroup[TTx]},
		{"OverviewHeartbeatsAndAudit", consoleOverview[TTx]},
	}
}

func consoleOf[TTx any](t *testing.T, e *Env[TTx]) store.Console {
	t.Helper()
	c, ok := e.Store.(store.Console)
	if !ok {
		t.Fatalf("%T does not implement store.Console", e.Store)
	}
	return c
}

// deadLetter stores a consumer's dead letter as the consumer middleware does.
func deadLetter[TTx any](t *testing.T, e *Env[TTx], consumer, id, key, eventType string, seq int64, reason string, at time.Time) {
	t.Helper()
	md := map[string]string{"outboxkit_event_type": eventType}
	if key != "" {
		md["outboxkit_partition_key"] = key
	}
	if seq > 0 {
		md["outboxkit_seq"] = fmt.Sprint(seq)
	}
	raw, _ := json.Marshal(md)
	if err := e.Store.Session().DeadLetter(context.Background(), store.InboxDeadLetter{Consumer: consumer, Topic: "orders", MessageID: id,
		Payload: []byte(`{"id":"` + id + `"}`), Metadata: raw, Reason: reason, Deliveries: 3, Now: at}); err != nil {
		t.Fatal(err)
	}
}

// deadOutbox writes n events on keys and dead-letters them all through a forwarder whose broker
// refuses them; it returns the clock the forwarder used.
func deadOutbox[TTx any](t *testing.T, e *Env[TTx], keys []string, perKey int, tune ...func(*forwarder.Config)) (*clock, []*message.Message) {
	t.Helper()
	msgs := write(t, e, keys, perKey)
	clk := newClock()
	pub := newFakePublisher()
	pub.setFail(func(*message.Message, int) error { return errBroken })
	f := newForwarder(t, e.Store, pub, clk, append([]func(*forwarder.Config){func(c *forwarder.Config) { c.MaxAttempts = 1 }}, tune...)...)
	drain(t, f, clk)
	return clk, msgs
}

type letterKey struct {
	side string
	id   int64
}

// everyPage pages through q and returns the letters, failing on a repeat or a break of order.
func everyPage(t *testing.T, c store.Console, q store.LetterQuery) []store.DeadLetter {
	t.Helper()
	seen := map[letterKey]bool{}
	var all []store.DeadLetter
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging did not end")
		}
		p, err := c.ListDeadLetters(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range p.Letters {
			k := letterKey{l.Side(), l.ID}
			if seen[k] {
				t.Fatalf("letter %v listed twice", k)
			}
			seen[k] = true
			if n := len(all); n > 0 && l.DeadLetteredAt.After(all[n-1].DeadLetteredAt) {
				t.Fatalf("letter %v (%s) listed after a newer one (%s)", k, l.DeadLetteredAt, all[n-1].DeadLetteredAt)
			}
			all = append(all, l)
		}
		if p.Next.IsZero() {
			return all
		}
		q.Before = p.Next
	}
}

func consoleListing[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	clk, _ := deadOutbox(t, e, []string{"o-1", "o-2", "o-3"}, 2) // 6 outbox letters, all at clk's instant
	base := clk.Now().Add(-time.Hour)
	for i := 0; i < 20; i++ {
		// Pairs share an instant, and one instant is the outbox's: ties across consumers and sides.
		at := base.Add(time.Duration(i/2) * time.Minute)
		if i == 19 {
			at = clk.Now()
		}
		deadLetter(t, e, "billing", fmt.Sprintf("b-%02d", i), fmt.Sprintf("k-%d", i%5), "OrderPlaced", int64(100+i),
			fmt.Sprintf(`customer "c-%04d" has no billing account`, i), at)
	}
	for i := 0; i < 10; i++ {
		deadLetter(t, e, "search", fmt.Sprintf("s-%02d", i), fmt.Sprintf("k-%d", i%5), "OrderPlaced", int64(200+i),
			"decode OrderPlaced: invalid character 'x' looking for beginning of value", base.Add(time.Duration(i)*time.Minute))
	}
	for _, tc := range []struct {
		q    store.LetterQuery
		want int
	}{
		{store.LetterQuery{Limit: 4}, 36},
		{store.LetterQuery{Side: "billing", Limit: 3}, 20},
		{store.LetterQuery{Side: store.SideConsumers, Limit: 7}, 30},
		{store.LetterQuery{Side: store.SideOutbox, Limit: 4}, 6},
		{store.LetterQuery{PartitionKey: "k-1", Limit: 2}, 6},
		{store.LetterQuery{Side: "search", PartitionKey: "o-1"}, 0},
	} {
		if got := everyPage(t, c, tc.q); len(got) != tc.want {
			t.Errorf("%+v: %d letters over every page, want %d", tc.q, len(got), tc.want)
		}
		n, capped, err := c.CountDeadLetters(ctx, tc.q, -1)
		if err != nil || n != int64(tc.want) || capped {
			t.Errorf("%+v: count %d (capped %v, %v), want %d", tc.q, n, capped, err, tc.want)
		}
	}
	if n, capped, err := c.CountDeadLetters(ctx, store.LetterQuery{}, 10); err != nil || n != 10 || !capped {
		t.Errorf("count capped at 10: %d, capped %v, %v", n, capped, err)
	}

	groups, err := c.GroupCounts(ctx, store.LetterQuery{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	billing, _ := store.FailureGroupOf("OrderPlaced", `customer "c-0001" has no billing account`)
	outbox, _ := store.FailureGroupOf("Happened", errBroken.Error())
	want := map[letterKey]int64{{"billing", billing}: 20, {store.SideOutbox, outbox}: 6}
	for _, g := range groups {
		if g.Side == "search" {
			continue
		}
		if want[letterKey{g.Side, g.FailureGroup}] != g.Count {
			t.Errorf("group %s/%d holds %d letters; want %v", g.Side, g.FailureGroup, g.Count, want)
		}
		delete(want, letterKey{g.Side, g.FailureGroup})
	}
	if len(want) > 0 || len(groups) != 3 {
		t.Fatalf("groups %+v: missing %v (the group ids must be store.FailureGroupOf's on every database)", groups, want)
	}
	byGroup := everyPage(t, c, store.LetterQuery{Side: "billing", FailureGroup: billing, ByGroup: true, Limit: 6})
	if len(byGroup) != 20 {
		t.Fatalf("billing's group lists %d letters, want 20", len(byGroup))
	}
	ex, err := c.GroupExample(ctx, store.SideOutbox, outbox)
	if err != nil || ex.Reason != errBroken.Error() || ex.EventType != "Happened" {
		t.Fatalf("outbox group example: %+v, %v", ex, err)
	}

	// The detail: a payload cut to the bound asked, its size told; an id that is not there.
	d, err := c.DeadLetter(ctx, "billing", byGroup[0].ID, 5)
	if err != nil || len(d.Payload) != 5 || d.PayloadSize <= 5 || d.Metadata["outboxkit_event_type"] != "OrderPlaced" || d.PartitionKey == "" {
		t.Fatalf("detail: %+v, %v", d, err)
	}
	if _, err := c.DeadLetter(ctx, "billing", 1<<40, 10); !errors.Is(err, store.ErrNoLetter) {
		t.Fatalf("a letter that is not there: %v, want ErrNoLetter", err)
	}
	if _, err := c.DeadLetter(ctx, "search", byGroup[0].ID, 10); !errors.Is(err, store.ErrNoLetter) {
		t.Fatalf("billing's letter read as search's: %v, want ErrNoLetter", err)
	}
	totals, err := c.DeadLetterTotals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int64{}
	for _, tt := range totals {
		sum[tt.Side] += tt.Count
	}
	if sum["billing"] != 20 || sum["search"] != 10 || sum[store.SideOutbox] != 6 {
		t.Fatalf("totals %+v", totals)
	}
}

// A filter no index serves (error text, topic, event type) reads a bounded number of letters
// per page and says where it stopped; following the cursor finds every match exactly once.
func consoleBoundedScan[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	base := time.Now().Add(-time.Hour)
	want := map[int64]bool{}
	for i := 0; i < 40; i++ {
		reason := "timeout talking to the warehouse"
		if i%7 == 0 {
			reason = "customer has no billing account"
		}
		deadLetter(t, e, "billing", fmt.Sprintf("m-%02d", i), "k", "OrderPlaced", int64(i+1), reason, base.Add(time.Duration(i)*time.Second))
	}
	q := store.LetterQuery{ErrorContains: "billing account", ScanLimit: 5, Limit: 50}
	stopped := 0
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("the bounded scan did not end")
		}
		p, err := c.ListDeadLetters(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if p.ScanStopped {
			stopped++
		}
		for _, l := range p.Letters {
			if want[l.ID] {
				t.Fatalf("letter %d found twice", l.ID)
			}
			want[l.ID] = true
		}
		if p.Next.IsZero() {
			break
		}
		q.Before = p.Next
	}
	if len(want) != 6 || stopped < 5 {
		t.Fatalf("found %d of 6 matches, %d pages stopped at the bound (want at least 5)", len(want), stopped)
	}
	groups, err := c.GroupCounts(context.Background(), store.LetterQuery{ErrorContains: "billing account"}, 10)
	if err != nil || len(groups) != 1 || groups[0].Count != 1 {
		t.Fatalf("groups of the 10 newest letters that match: %+v, %v (want 1 letter: only m-35 is among them)", groups, err)
	}
}

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

// writeTopics commits one event per (topic, key), in order.
func writeTopics[TTx any](t *testing.T, e *Env[TTx], pairs ...[2]string) {
	t.Helper()
	if err := e.InTx(context.Background(), func(tx TTx) error {
		pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		for _, p := range pairs {
			if err := pub.Publish(p[0], pipeline.NewEvent("Happened", p[1], []byte(`{}`))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func claimTopics(t *testing.T, s store.Store, relay string) []string {
	t.Helper()
	ctx := context.Background()
	cl, err := s.Claim(ctx, store.ClaimParams{Now: time.Now(), Limit: 100, Owner: relay + "-1", Relay: relay, Hold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Abandon(ctx)
	var out []string
	for _, r := range cl.Rows() {
		out = append(out, r.Topic+"/"+r.PartitionKey)
	}
	return out
}

func consolePause[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	writeTopics(t, e, [2]string{"a", "k1"}, [2]string{"b", "k1"}, [2]string{"b", "k2"})
	if created, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "a", By: "alice", At: time.Now()}); err != nil || !created {
		t.Fatalf("pause: %v, %v", created, err)
	}
	if created, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "a", By: "bob", At: time.Now()}); err != nil || created {
		t.Fatalf("pausing twice: created %v, %v; want the first pause kept", created, err)
	}
	// Topic a waits, and so does k1's later row on topic b: a key's order holds across topics.
	if got := claimTopics(t, e.Store, "r1"); !slices.Equal(got, []string{"b/k2"}) {
		t.Fatalf("claimed %v with topic a paused, want [b/k2]", got)
	}
	if ps, err := c.Pauses(ctx); err != nil || len(ps) != 1 || ps[0].By != "alice" {
		t.Fatalf("pauses: %+v, %v", ps, err)
	}
	if ok, err := c.ClearPause(ctx, store.PauseTopic, "a"); err != nil || !ok {
		t.Fatalf("resume: %v, %v", ok, err)
	}
	if _, err := c.SetPause(ctx, store.Pause{Scope: store.PauseRelay, Name: "r1", By: "alice", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := claimTopics(t, e.Store, "r1"); len(got) != 0 {
		t.Fatalf("paused relay r1 claimed %v", got)
	}
	if got := claimTopics(t, e.Store, "r2"); len(got) != 3 {
		t.Fatalf("relay r2 claimed %v, want all 3 rows", got)
	}
	if ok, err := c.ClearPause(ctx, store.PauseTopic, "a"); err != nil || ok {
		t.Fatalf("resuming what is not paused: %v, %v; want false", ok, err)
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

func consoleRegroup[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	deadLetter(t, e, "billing", "m-1", "k-9", "OrderPaid", 7, `customer "c-1" is blocked`, time.Now())
	deadOutbox(t, e, []string{"o"}, 1)
	// As stored before the console's migration.
	e.MustExec(t, `UPDATE {{schema}}.dead_letters SET failure_group = NULL, event_type = NULL, partition_key = NULL, source_seq = 0`)
	e.MustExec(t, `UPDATE {{schema}}.outbox SET failure_group = NULL, event_type = NULL`)
	n, err := c.Regroup(ctx, 10)
	if err != nil || n != 2 {
		t.Fatalf("regrouped %d (%v), want 2", n, err)
	}
	if n, err := c.Regroup(ctx, 10); err != nil || n != 0 {
		t.Fatalf("regrouped %d again (%v), want 0", n, err)
	}
	g, _ := store.FailureGroupOf("OrderPaid", `customer "c-2" is blocked`)
	got := everyPage(t, c, store.LetterQuery{Side: "billing", FailureGroup: g, ByGroup: true, PartitionKey: "k-9"})
	if len(got) != 1 || got[0].EventType != "OrderPaid" {
		t.Fatalf("the regrouped letter by group and key: %+v", got)
	}
	og, _ := store.FailureGroupOf("Happened", errBroken.Error())
	if got := everyPage(t, c, store.LetterQuery{Side: store.SideOutbox, FailureGroup: og, ByGroup: true}); len(got) != 1 {
		t.Fatalf("the regrouped outbox letter: %+v", got)
	}
}

func consoleOverview[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	writeTopics(t, e, [2]string{"a", "k1"}, [2]string{"a", "k2"}, [2]string{"b", "k1"})
	topics, capped, err := c.TopicBacklog(ctx, 2)
	if err != nil || !capped || len(topics) != 1 || topics[0].Topic != "a" || topics[0].Pending != 2 {
		t.Fatalf("backlog read to 2 rows: %+v, capped %v, %v", topics, capped, err)
	}
	topics, capped, err = c.TopicBacklog(ctx, 10)
	if err != nil || capped || len(topics) != 2 || topics[0].OldestCreated.IsZero() {
		t.Fatalf("whole backlog: %+v, capped %v, %v", topics, capped, err)
	}
	if _, err := e.Store.Session().Processed(ctx, "billing", "m-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if counts, err := c.ProcessedSince(ctx, time.Now().Add(-time.Hour), 100); err != nil || len(counts) != 0 {
		// Processed's inbox row was rolled back: nothing was processed.
		t.Fatalf("processed: %+v, %v", counts, err)
	}
	if parked, err := c.ParkedCounts(ctx); err != nil || len(parked) != 0 {
		t.Fatalf("parked: %+v, %v", parked, err)
	}
	beat := store.RelayBeat{Owner: "demo-1", Name: "demo", Host: "h", PID: 7, Started: time.Now(), At: time.Now(), PublishedTotal: 3,
		PublishedByTopic: map[string]int64{"a": 3}, PausesSeen: time.Now()}
	for i := 0; i < 2; i++ {
		beat.PublishedTotal += int64(i)
		if err := c.RelayHeartbeat(ctx, beat); err != nil {
			t.Fatal(err)
		}
	}
	relays, err := c.Relays(ctx)
	if err != nil || len(relays) != 1 || relays[0].PublishedTotal != 4 || relays[0].PublishedByTopic["a"] != 3 || !relays[0].LastPass.IsZero() {
		t.Fatalf("relays: %+v, %v", relays, err)
	}
	for i, action := range []string{"replay", "pause"} {
		if err := c.Audit(ctx, store.AuditEntry{At: time.Now(), Actor: "alice", Role: "operator", Action: action, Matched: int64(i),
			Result: "ok", OK: i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	log, err := c.AuditLog(ctx, 0, 10)
	if err != nil || len(log) != 2 || log[0].Action != "pause" || log[0].OK || !log[1].OK {
		t.Fatalf("audit, newest first: %+v, %v", log, err)
	}
	if older, err := c.AuditLog(ctx, log[0].ID, 10); err != nil || len(older) != 1 || older[0].Action != "replay" {
		t.Fatalf("audit before the newest: %+v, %v", older, err)
	}
	cur, newest, err := c.SchemaVersion(ctx)
	if err != nil || cur != newest || cur == 0 {
		t.Fatalf("schema version %d of %d, %v", cur, newest, err)
	}
}

// pausingPublisher pauses the topic at the first publish and holds it until the relay has read
// the pause: every later row of the same pass must then stay unpublished.
type pausingPublisher struct {
	*fakePublisher
	pause func()
	once  bool
}

func (p *pausingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.once {
		p.once = true
		p.pause()
	}
	return p.fakePublisher.Publish(topic, msgs...)
}

// A pause set in the middle of a pass stops the relay at the next row, once its heartbeat has read
// it; resumed, the rows go out in order.
func consolePauseWithinAPass[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	msgs := write(t, e, keysN(5), 2)
	inner := newFakePublisher()
	pub := &pausingPublisher{fakePublisher: inner}
	pub.pause = func() {
		if _, err := c.SetPause(ctx, store.Pause{Scope: store.PauseTopic, Name: "events", By: "alice", At: time.Now()}); err != nil {
			t.Error(err)
			return
		}
		at := time.Now() // after the commit: a heartbeat that read the pauses later saw it

		if !waitFor(10*time.Second, func() bool {
			relays, err := c.Relays(ctx)
			return err == nil && len(relays) == 1 && !relays[0].PausesSeen.Before(at)
		}) {
			t.Error("the relay's heartbeat did not read the pause within 10s")
		}
	}
	f := newForwarder(t, e.Store, pub, newClock(), func(cfg *forwarder.Config) {
		cfg.Now = time.Now
		cfg.MaxInFlight = 1
		cfg.HeartbeatInterval = 20 * time.Millisecond
		cfg.PollInterval = 50 * time.Millisecond
	})
	RunForwarder(t, f)
	if !waitFor(10*time.Second, func() bool { return !f.Health().LastPass.IsZero() }) {
		t.Fatal("no pass completed within 10s")
	}
	if n := len(inner.accepted()); n != 1 {
		t.Fatalf("%d rows published in the pass that was paused after its first row, want 1", n)
	}
	if _, err := c.ClearPause(ctx, store.PauseTopic, "events"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return len(inner.accepted()) == len(msgs) }) {
		t.Fatalf("resumed: %d of %d rows published within 10s", len(inner.accepted()), len(msgs))
	}
	assertPerKeyOrder(t, inner.accepted())
}
