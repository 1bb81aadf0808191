package redisbackend

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
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

func TestRedisMarshaller_ReadsAForeignEntry(t *testing.T) {
	m := redisMarshaller{wire: brokerio.NewWire(backends.Options{CloudEvents: true})}
	values, err := m.Marshal("orders", relayed())
	if err != nil || values["ce_id"] != "0192-uuid" || values["ce_type"] != "OrderPlaced" {
		t.Fatalf("marshal: %v %v", values, err)
	}
	msg, err := m.Unmarshal(map[string]interface{}{"ce_id": "py-1", "ce_type": "OrderPlaced", "data": `{"a":1}`})
	if err != nil || msg.UUID != "py-1" || string(msg.Payload) != `{"a":1}` || outboxkit.EventType(msg) != "OrderPlaced" {
		t.Fatalf("foreign entry read as %v, %v", msg, err)
	}
	if _, err := m.Unmarshal(map[string]interface{}{"data": "x"}); err == nil {
		t.Fatal("an entry with no id at all was accepted; it could never be deduplicated")
	}
}
