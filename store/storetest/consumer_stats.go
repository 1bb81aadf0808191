package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

func consumerStats[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	stack := e.stack(t, "shipping", e.effect("shipping"))
	a, b := orderMsg("a"), orderMsg("b")
	for _, m := range []*message.Message{a, a, a, b, message.NewMessage("bad", []byte("not json"))} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	stats, err := middleware.Stats(context.Background(), e.Store)
	if err != nil {
		t.Fatal(err)
	}
	want := store.ConsumerStats{Consumer: "shipping", Processed: 2, Duplicates: 2, DeadLetters: 1}
	if len(stats) != 1 || stats[0] != want {
		t.Fatalf("stats = %+v, want %+v", stats, want)
	}
}

// The dead letters that wait for a replay are gauges read from the store at each scrape, per
// consumer on one registry: a replay takes them down, nothing else does (the dead-letter counter's
// rate forgets them within its window while they still wait).
func deadLettersWaiting[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	clock := time.Now()
	e.now = func() time.Time { return clock }
	shipping := e.stack(t, "shipping", e.effect("shipping"))
	billing := e.stack(t, "billing", e.effect("billing"))
	for _, m := range []*message.Message{message.NewMessage("bad-1", []byte("not json")), message.NewMessage("bad-2", []byte("{")), orderMsg("ok")} {
		if _, err := shipping(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := billing(delivery(orderMsg("fine"))); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(90 * time.Second)
	expect := func(consumer string, count float64, minAge, maxAge float64) {
		t.Helper()
		n := e.gauge(t, "outboxkit_consumer_dead_letters_waiting", consumer)
		age := e.gauge(t, "outboxkit_consumer_oldest_dead_letter_age_seconds", consumer)
		if n != count || age < minAge || age > maxAge {
			t.Fatalf("%s: waiting %v, oldest age %vs (-1: not exported); want %v waiting, age in [%v, %v]",
				consumer, n, age, count, minAge, maxAge)
		}
	}
	expect("shipping", 2, 60, 120) // dead-lettered about 90s before the scrape's clock
	expect("billing", 0, 0, 0)

	letters, err := e.Store.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping"})
	if err != nil || len(letters) != 2 {
		t.Fatalf("dead letters %v, %v", letters, err)
	}
	if err := e.Store.MarkReplayed(context.Background(), letters[0].ID, clock); err != nil {
		t.Fatal(err)
	}
	expect("shipping", 1, 60, 120)
	if err := e.Store.MarkReplayed(context.Background(), letters[1].ID, clock); err != nil {
		t.Fatal(err)
	}
	expect("shipping", 0, 0, 0)
}
