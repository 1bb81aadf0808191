package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// consoleTests are the Console group: store.Console's subtests, each in the file of its subject
// (console_letters.go, console_jobs.go, …); this file holds what they share.
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
