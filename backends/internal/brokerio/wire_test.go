package brokerio

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
)

func relayed() *message.Message {
	msg := message.NewMessage("0192-uuid", []byte(`{"id":"o-1"}`))
	outboxkit.SetEventType(msg, "OrderPlaced")
	outboxkit.SetPartitionKey(msg, "o-1")
	msg.Metadata.Set(outboxkit.MetadataCreatedAt, "2026-11-30T10:00:00.5Z")
	msg.Metadata.Set(outboxkit.MetadataContentType, "application/json")
	msg.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	return msg
}

func TestWireFormat_CloudEventsAttributes(t *testing.T) {
	w := NewWire(backends.Options{CloudEvents: true})
	got := w.CEAttributes("orders", relayed())
	want := map[string]string{
		"specversion": "1.0", "id": "0192-uuid", "source": backends.DefaultCloudEventsSource, "type": "OrderPlaced",
		"time": "2026-11-30T10:00:00.5Z", "partitionkey": "o-1", "datacontenttype": "application/json",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if typ := w.CEAttributes("orders", message.NewMessage("x", nil))["type"]; typ != "orders" {
		t.Errorf("a message without an event type has type %q; the required attribute falls back to the topic", typ)
	}
	if NewWire(backends.Options{}).CEAttributes("orders", relayed()) != nil {
		t.Error("attributes written with CloudEvents off")
	}
}
