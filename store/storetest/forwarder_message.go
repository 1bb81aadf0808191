package storetest

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
)

func messageCarriesIdentityAndOrigin[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"order-1"}, 1)
	var got *message.Message
	pub := newFakePublisher()
	pub.setFail(func(m *message.Message, _ int) error { got = m; return nil })
	dispatch(t, newForwarder(t, e.Store, pub, newClock(), func(c *forwarder.Config) {
		c.TopicMapping = func(topic, key string) string { return "prod." + topic + "." + key }
	}))
	if got == nil || got.UUID != msgs[0].UUID || string(got.Payload) != string(msgs[0].Payload) {
		t.Fatalf("published %+v, want the outbox message %s", got, msgs[0].UUID)
	}
	if outboxkit.PartitionKey(got) != "order-1" || outboxkit.EventType(got) != "Happened" {
		t.Errorf("metadata lost: %v", got.Metadata)
	}
	if created, ok := outboxkit.CreatedAt(got); !ok || time.Since(created) > time.Minute || time.Until(created) > time.Minute {
		t.Errorf("created_at stamp = %q", got.Metadata.Get(outboxkit.MetadataCreatedAt))
	}
	if s := pub.accepted(); s[0].topic != "prod.events.order-1" {
		t.Errorf("topic = %q, want the mapped prod.events.order-1", s[0].topic)
	}
}
