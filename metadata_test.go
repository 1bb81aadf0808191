package outboxkit_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

func TestBrokerDedupID_ReplayGetsAnIdOfItsOwn(t *testing.T) {
	msg := message.NewMessage("0190-uuid", nil)
	if got := outboxkit.BrokerDedupID(msg); got != "0190-uuid" {
		t.Fatalf("plain message: %q, want its UUID", got)
	}
	msg.Metadata.Set(outboxkit.MetadataReplay, "17.99")
	first := outboxkit.BrokerDedupID(msg)
	msg.Metadata.Set(outboxkit.MetadataReplay, "17.100")
	second := outboxkit.BrokerDedupID(msg)
	if first == "0190-uuid" || first == second {
		t.Fatalf("replays got %q and %q: each replay needs an id of its own, never the UUID", first, second)
	}
}
