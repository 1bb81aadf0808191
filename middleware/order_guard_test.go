package middleware_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
)

func versioned(key string, version int64) *message.Message {
	m := orderMsg(key)
	outboxkit.SetPartitionKey(m, key)
	outboxkit.SetVersion(m, version)
	return m
}

func TestOrderGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stack := e.stack(t, "search", effect("search"), func(c *middleware.StackConfig) {
		c.OrderGuard = true
		c.MaxDeliveries = 3
		c.MaxRetries = 2
	})
	v1, v2, v3 := versioned("order-1", 1), versioned("order-1", 2), versioned("order-1", 3)

	// v2 arrives before v1: parked (nacked), not applied.
	if _, err := stack(delivery(v2)); err == nil || !strings.Contains(err.Error(), "ahead of its turn") {
		t.Fatalf("v2 before v1: got %v, want it parked", err)
	}
	if e.count(t, "effects", "search", v2.UUID) != 0 {
		t.Fatal("v2 was applied before v1")
	}
	// v1, then v2 on redelivery: both applied, in order.
	for _, m := range []*message.Message{v1, v2} {
		if _, err := stack(delivery(m)); err != nil {
			t.Fatalf("in-order delivery failed: %v", err)
		}
	}
	if e.count(t, "effects", "search", v1.UUID) != 1 || e.count(t, "effects", "search", v2.UUID) != 1 {
		t.Fatal("v1 and v2 not both applied")
	}
	if v := e.pg.Int(t, `SELECT version FROM {{schema}}.inbox_versions WHERE consumer = 'search' AND partition_key = 'order-1'`); v != 2 {
		t.Fatalf("stored version %d, want 2", v)
	}

	// A stale event (a different message carrying an old version) is acknowledged and skipped.
	stale := versioned("order-1", 1)
	if _, err := stack(delivery(stale)); err != nil || e.count(t, "effects", "search", stale.UUID) != 0 {
		t.Fatalf("stale version: err %v, applied %d times; want acknowledged and skipped", err, e.count(t, "effects", "search", stale.UUID))
	}

	// v5 with v4 never coming: parked on each delivery, then quarantined with the versions.
	v5 := versioned("order-1", 5)
	if n := redeliverUntilAcked(t, stack, v5, 10); n != 3 {
		t.Fatalf("v5 quarantined after %d deliveries, want MaxDeliveries = 3", n)
	}
	letters := deadLetters(t, e, middleware.DeadLetterFilter{MessageIDs: []string{v5.UUID}})
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "version 5") || !strings.Contains(letters[0].Reason, "version 3 not applied") {
		t.Fatalf("dead letters = %+v; want the reason to name the versions", letters)
	}
	// v3 still goes through: the guard did not advance past the gap.
	if _, err := stack(delivery(v3)); err != nil || e.count(t, "effects", "search", v3.UUID) != 1 {
		t.Fatalf("v3: %v", err)
	}
	// Messages without a version are not guarded.
	if _, err := stack(delivery(orderMsg("plain"))); err != nil {
		t.Fatal(err)
	}
}
