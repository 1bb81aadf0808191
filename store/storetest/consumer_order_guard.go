package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

func versioned(key string, version int64) *message.Message {
	m := orderMsg(key)
	outboxkit.SetPartitionKey(m, key)
	outboxkit.SetVersion(m, version)
	return m
}

func orderGuard[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var transient atomic.Bool
	hf := func(m *message.Message) error {
		switch m.Metadata.Get("test_fail") {
		case "permanent":
			return handlers.Permanent(errors.New("this version cannot be applied"))
		case "transient":
			if transient.Load() {
				return errTransient
			}
		}
		return e.effect("search")(m)
	}
	stack := e.stack(t, "search", hf, func(c *middleware.StackConfig) {
		c.OrderGuard = &middleware.OrderGuardConfig{}
		c.MaxDeliveries = 3
		c.MaxRetries = -1
	})
	applied := func(msgs ...*message.Message) bool {
		for _, m := range msgs {
			if e.count(t, "effects", "search", m.UUID) != 1 {
				return false
			}
		}
		return true
	}
	version := func() int {
		return e.MustInt(t, `SELECT version FROM {{schema}}.inbox_versions WHERE consumer = 'search' AND partition_key = 'order-1'`)
	}
	parked := func() int {
		return e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_parked WHERE consumer = 'search' AND partition_key = 'order-1'`)
	}
	v := make([]*message.Message, 12)
	for i := 1; i < len(v); i++ {
		v[i] = versioned("order-1", int64(i))
	}

	// v2 arrives before v1: parked in the database and acknowledged (it never waits in the
	// broker, where Kafka or Redis Streams would redeliver it in place, ahead of everything).
	if _, err := stack(delivery(v[2])); err != nil {
		t.Fatalf("v2 before v1: %v; want it parked and acknowledged", err)
	}
	if applied(v[2]) || parked() != 1 {
		t.Fatalf("v2 before v1: applied %v, %d parked; want it parked, not applied", applied(v[2]), parked())
	}
	// The consumer's stats say it waits.
	stats, err := middleware.Stats(context.Background(), e.Store)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Consumer != "search" || stats[0].Parked != 1 {
		t.Fatalf("stats = %+v, want search with 1 parked", stats)
	}
	// Its redelivery is a duplicate.
	if _, err := stack(delivery(v[2])); err != nil || parked() != 1 {
		t.Fatalf("v2 again: %v, %d parked", err, parked())
	}
	// v1 applies v1 and then v2, in one transaction.
	if _, err := stack(delivery(v[1])); err != nil {
		t.Fatal(err)
	}
	if !applied(v[1], v[2]) || version() != 2 || parked() != 0 {
		t.Fatalf("after v1: v1 and v2 applied %v, version %d, %d parked; want both, 2, 0", applied(v[1], v[2]), version(), parked())
	}
	// A stale event (a different message carrying an old version) is acknowledged and skipped.
	stale := versioned("order-1", 1)
	if _, err := stack(delivery(stale)); err != nil || e.count(t, "effects", "search", stale.UUID) != 0 {
		t.Fatalf("stale version: err %v; want acknowledged and skipped", err)
	}
	// A gap of two: v5 and v4 wait for v3, which applies all three in order.
	for _, m := range []*message.Message{v[5], v[4], v[3]} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !applied(v[3], v[4], v[5]) || version() != 5 || parked() != 0 {
		t.Fatalf("after v3: applied %v, version %d, %d parked", applied(v[3], v[4], v[5]), version(), parked())
	}
	// A parked version that fails for good when its turn comes is dead-lettered; its predecessor
	// commits, and the version after it stays parked until it is replayed.
	v[7].Metadata.Set("test_fail", "permanent")
	for _, m := range []*message.Message{v[7], v[8], v[6]} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !applied(v[6]) || applied(v[7]) || applied(v[8]) || version() != 6 || parked() != 1 {
		t.Fatalf("after v6: v6 %v v7 %v v8 %v, version %d, %d parked; want v6 alone applied, v8 parked",
			applied(v[6]), applied(v[7]), applied(v[8]), version(), parked())
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{MessageIDs: []string{v[7].UUID}})
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "version 7") || !strings.Contains(letters[0].Reason, "cannot be applied") {
		t.Fatalf("dead letters = %+v; want v7 with its reason", letters)
	}
	// The replay of v7 (fixed) runs — its inbox row went with the park — and brings v8 along.
	fixed := delivery(v[7])
	fixed.Metadata.Set("test_fail", "")
	if _, err := stack(fixed); err != nil {
		t.Fatal(err)
	}
	if !applied(v[7], v[8]) || version() != 8 || parked() != 0 {
		t.Fatalf("after v7's replay: applied %v, version %d, %d parked", applied(v[7], v[8]), version(), parked())
	}
	// A parked version that fails for now rolls its predecessor back too: the predecessor's
	// redelivery tries both again.
	v[10].Metadata.Set("test_fail", "transient")
	transient.Store(true)
	if _, err := stack(delivery(v[10])); err != nil {
		t.Fatal(err)
	}
	if _, err := stack(delivery(v[9])); err == nil {
		t.Fatal("v9 succeeded although v10, parked behind it, failed")
	}
	if applied(v[9]) || applied(v[10]) || version() != 8 || parked() != 1 {
		t.Fatalf("after the failure: v9 %v v10 %v, version %d, %d parked; want nothing applied, v10 parked", applied(v[9]), applied(v[10]), version(), parked())
	}
	transient.Store(false)
	if _, err := stack(delivery(v[9])); err != nil || !applied(v[9], v[10]) || version() != 10 {
		t.Fatalf("v9 again: %v, applied %v, version %d", err, applied(v[9], v[10]), version())
	}
	// Messages without a version are not guarded.
	if _, err := stack(delivery(orderMsg("plain"))); err != nil {
		t.Fatal(err)
	}

	// Two deliveries of a new key at once, the second version first: whichever is judged first,
	// the other waits for it, so version 2 is never left parked behind an applied version 1.
	const keys = 20
	var wg sync.WaitGroup
	var failed atomic.Int32
	pairs := make([][2]*message.Message, keys)
	for k := range pairs {
		key := fmt.Sprintf("race-%d", k)
		pairs[k] = [2]*message.Message{versioned(key, 1), versioned(key, 2)}
		for _, m := range []*message.Message{pairs[k][1], pairs[k][0]} {
			wg.Add(1)
			go func(m *message.Message) {
				defer wg.Done()
				if _, err := stack(delivery(m)); err != nil {
					failed.Add(1)
				}
			}(m)
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d concurrent deliveries failed", failed.Load())
	}
	for _, p := range pairs {
		if !applied(p[0], p[1]) {
			t.Fatalf("key %s: version 1 applied %v, version 2 applied %v; want both", outboxkit.PartitionKey(p[0]), applied(p[0]), applied(p[1]))
		}
	}
}
