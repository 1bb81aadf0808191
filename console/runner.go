package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// wakeRunner makes the job runner look for work now rather than at its next poll.
func (h *Handler) wakeRunner() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// runJobs claims open jobs whose lease ran out — new ones, and those of a console that stopped —
// and runs them one at a time, until ctx ends.
func (h *Handler) runJobs(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			j, ok, err := h.con.ClaimJob(ctx, h.owner, h.cfg.Now(), h.cfg.JobLease)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, store.ErrNotMigrated) {
					h.cfg.Logger.Error("Cannot claim a console job; retrying", err, nil)
				}
				break
			}
			if !ok {
				break
			}
			_, _ = h.run(ctx, j, true) // how it ended is in its row; run logs a failure
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.wake:
		}
	}
}

// runInline runs a small job (selected letters) in the request that created it, without pacing.
// A job runner (this console's own, or another's) may claim the job between its creation and
// this call: then the request waits for that runner to end it, and answers with how it ended.
func (h *Handler) runInline(ctx context.Context, created store.Job) (store.Job, error) {
	j, ok, err := h.con.TakeJob(ctx, created.ID, h.owner, h.cfg.Now(), h.cfg.JobLease)
	if err != nil {
		return j, err
	}
	if ok {
		return h.run(ctx, j, false)
	}
	wait, cancel := context.WithTimeout(ctx, h.cfg.JobLease)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		j, err := h.con.Job(wait, created.ID)
		if err == nil && !j.Open() {
			return j, nil
		}
		select {
		case <-wait.Done():
			if err == nil {
				err = fmt.Errorf("job %d, taken by another console, has not ended in %s: see the jobs page", created.ID, h.cfg.JobLease)
			}
			return j, err
		case <-tick.C:
		}
	}
}

// run works a claimed job to its end, one batch at a time: each batch renews the lease (and reads
// a cancel request), waits out backpressure, applies the batch in the job's order, and then, when
// paced, waits so that the job keeps to its rate. It returns the job as it ended.
func (h *Handler) run(ctx context.Context, j store.Job, paced bool) (store.Job, error) {
	l := store.JobLease{ID: j.ID, Owner: h.owner, Token: j.LeaseToken}
	fields := watermill.LogFields{"job": j.ID, "kind": j.Kind, "side": j.Side}
	batch := 500
	if paced {
		batch = min(500, max(1, j.Rate/4))
	}
	waiting := ""
	for {
		cur, err := h.con.RenewJob(ctx, l, h.cfg.Now().Add(h.cfg.JobLease), waiting)
		if err != nil {
			return h.stopped(ctx, l, j, err, fields)
		}
		if cur.State == store.JobCancelling {
			return h.finish(ctx, l, cur, store.JobCancelled, "")
		}
		if waiting != "" {
			if !sleep(ctx, time.Second) {
				return cur, ctx.Err()
			}
		}
		if paced && j.Side == store.SideOutbox && j.Kind == store.JobReplay {
			if waiting = h.backpressure(ctx); waiting != "" {
				continue
			}
		}
		start := time.Now()
		var (
			step  store.JobStep
			count int
		)
		if j.Side == store.SideOutbox {
			step, err = h.con.StepOutboxJob(ctx, l, batch, h.cfg.Now())
			count = int(step.Applied + step.Skipped)
		} else {
			step, count, waiting, err = h.consumerBatch(ctx, l, j, batch, paced)
		}
		if err != nil {
			return h.stopped(ctx, l, j, err, fields)
		}
		if step.Done {
			return h.finish(ctx, l, j, store.JobDone, "")
		}
		if paced && count > 0 && !sleep(ctx, time.Until(start.Add(time.Duration(float64(count)/float64(j.Rate)*float64(time.Second))))) {
			return j, ctx.Err()
		}
	}
}

// stopped ends a run that failed: a lost lease leaves the job to its new runner; a database
// failure, or the end of ctx, leaves it to any console once its lease runs out; anything else
// fails the job with the reason.
func (h *Handler) stopped(ctx context.Context, l store.JobLease, j store.Job, err error, fields watermill.LogFields) (store.Job, error) {
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		h.cfg.Logger.Info("Another console took over a job whose lease ran out", fields)
		return j, err
	case ctx.Err() != nil || outboxkit.IsUnreachable(err):
		h.cfg.Logger.Error("A console job stopped; it resumes from its cursor once its lease runs out", err, fields)
		return j, err
	}
	h.cfg.Logger.Error("A console job failed", err, fields)
	return h.finish(ctx, l, j, store.JobFailed, err.Error())
}

func (h *Handler) finish(ctx context.Context, l store.JobLease, j store.Job, state, lastError string) (store.Job, error) {
	if err := h.con.FinishJob(context.WithoutCancel(ctx), l, state, lastError, h.cfg.Now()); err != nil {
		if !errors.Is(err, store.ErrLeaseLost) { // else the console that took it over ends it
			h.cfg.Logger.Error("Cannot record how a console job ended; a console takes it up again once its lease runs out", err,
				watermill.LogFields{"job": j.ID, "kind": j.Kind, "state": state})
		}
		return j, err
	}
	h.cache.invalidate()
	done, err := h.con.Job(context.WithoutCancel(ctx), j.ID)
	if err != nil {
		return j, err
	}
	if len(done.Filter.IDs) == 0 { // a selection's job is audited by its request
		verb := map[string]string{store.JobReplay: "replayed", store.JobArchive: "archived"}[done.Kind]
		_ = h.con.Audit(context.WithoutCancel(ctx), store.AuditEntry{At: h.cfg.Now(), Actor: done.CreatedBy, Role: "job", Action: done.Kind + " " + state,
			Filter:  filterQuery(filterOf(done.Filter)).Encode(),
			Matched: done.Total, Affected: done.Applied, JobID: done.ID, OK: state != store.JobFailed,
			Result: fmt.Sprintf("job #%d %s: %d %s, %d skipped (already replayed or archived), %d failed%s", done.ID, state, done.Applied, verb,
				done.Skipped, done.Failed, map[bool]string{true: ": " + lastError}[lastError != ""])})
	}
	return done, nil
}

// backpressure says why an outbox replay should wait: the relay has more rows pending (its own
// replayed rows included; paused topics' not) than Backpressure. "" when it should not.
func (h *Handler) backpressure(ctx context.Context) string {
	if h.cfg.Backpressure < 0 {
		return ""
	}
	backlog, _, err := h.con.TopicBacklog(ctx, h.cfg.Backpressure+1)
	if err != nil {
		return "cannot read the relay's backlog: " + err.Error()
	}
	pauses, err := h.con.Pauses(ctx)
	if err != nil {
		return "cannot read the pauses: " + err.Error()
	}
	paused := map[string]bool{}
	for _, p := range pauses {
		if p.Scope == store.PauseTopic {
			paused[p.Name] = true
		}
	}
	var pending int64
	for _, b := range backlog {
		if !paused[b.Topic] {
			pending += b.Pending
		}
	}
	if pending > int64(h.cfg.Backpressure) {
		return fmt.Sprintf("backpressure: the relay has more than %s rows pending; the job resumes as it publishes them", commas(int64(h.cfg.Backpressure)))
	}
	return ""
}

// consumerBatch sends the next letters of a consumers' job back to their topics, one publish per
// letter in the job's order, and records them. A broker that cannot be reached ends the batch
// early and the job waits (the letters not sent stay waiting); a letter the broker refuses is
// counted failed and left waiting.
func (h *Handler) consumerBatch(ctx context.Context, l store.JobLease, j store.Job, n int, paced bool) (store.JobStep, int, string, error) {
	letters, err := h.con.NextConsumerLetters(ctx, l, n)
	if err != nil {
		return store.JobStep{}, 0, "", err
	}
	if j.Kind == store.JobArchive {
		step, err := h.con.CommitConsumerLetters(ctx, l, letters, nil, h.cfg.Now())
		step.Done = len(letters) < n
		return step, len(letters), "", err
	}
	if h.cfg.Publisher == nil {
		return store.JobStep{}, 0, "", errors.New("this console has no publisher: consumers' dead letters cannot be replayed from it")
	}
	if err := h.con.ResetLetterDeliveries(ctx, letters); err != nil {
		return store.JobStep{}, 0, "", err
	}
	var sent, failed []store.DeadLetter
	waiting := ""
	start := time.Now()
	for i, d := range letters {
		if paced && !sleep(ctx, time.Until(start.Add(time.Duration(float64(i)/float64(j.Rate)*float64(time.Second))))) {
			break
		}
		msg := message.NewMessage(d.MessageID, d.Payload)
		msg.Metadata = message.Metadata{}
		for k, v := range d.Metadata {
			msg.Metadata.Set(k, v)
		}
		// A token of this replay: brokers that drop a re-publish of a known id deliver it anyway.
		msg.Metadata.Set(outboxkit.MetadataReplay, fmt.Sprintf("job%d.%d.%d", j.ID, d.ID, h.cfg.Now().UnixNano()))
		msg.SetContext(ctx)
		err := h.cfg.Publisher.Publish(d.Topic, msg)
		switch {
		case err == nil:
			sent = append(sent, d)
		case outboxkit.IsUnreachable(err) || ctx.Err() != nil:
			waiting = "the broker cannot be reached (" + err.Error() + "): the job resumes when it answers"
		default:
			failed = append(failed, d)
			h.cfg.Logger.Error("A replayed dead letter was refused by the broker; it stays waiting", err,
				watermill.LogFields{"job": j.ID, "letter": d.ID, "topic": d.Topic})
		}
		if waiting != "" {
			break
		}
	}
	// Committed with a context of its own: what was published is recorded even at shutdown (a
	// crash between publish and commit republishes at most this batch, which the inboxes absorb).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	step, err := h.con.CommitConsumerLetters(cctx, l, sent, failed, h.cfg.Now())
	step.Done = waiting == "" && ctx.Err() == nil && len(letters) < n
	return step, len(sent) + len(failed), waiting, err
}

// sleep waits d, or until ctx ends: false then.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
