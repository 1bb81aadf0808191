package backends

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
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
	w := newWireFormat(Options{CloudEvents: true})
	got := w.ceAttributes("orders", relayed())
	want := map[string]string{
		"specversion": "1.0", "id": "0192-uuid", "source": DefaultCloudEventsSource, "type": "OrderPlaced",
		"time": "2026-11-30T10:00:00.5Z", "partitionkey": "o-1", "datacontenttype": "application/json",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if typ := w.ceAttributes("orders", message.NewMessage("x", nil))["type"]; typ != "orders" {
		t.Errorf("a message without an event type has type %q; the required attribute falls back to the topic", typ)
	}
	if newWireFormat(Options{}).ceAttributes("orders", relayed()) != nil {
		t.Error("attributes written with CloudEvents off")
	}
}

// A record kcat or another SDK wrote in the Kafka binding's binary mode: no Watermill UUID header.
func TestKafkaMarshaler_ReadsAForeignCloudEvent(t *testing.T) {
	m := kafkaMarshaler{inner: kafka.NewWithPartitioningMarshaler(kafkaKey), wire: newWireFormat(Options{})}
	rec := &sarama.ConsumerMessage{Key: []byte("o-9"), Value: []byte(`{}`), Headers: []*sarama.RecordHeader{
		{Key: []byte("ce_id"), Value: []byte("evt-1")}, {Key: []byte("ce_type"), Value: []byte("OrderPlaced")},
		{Key: []byte("ce_source"), Value: []byte("/node")}, {Key: []byte("ce_specversion"), Value: []byte("1.0")},
		{Key: []byte("ce_time"), Value: []byte("2026-11-30T10:00:00Z")}, {Key: []byte("content-type"), Value: []byte("application/json")},
	}}
	msg, err := m.Unmarshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if msg.UUID != "evt-1" || outboxkit.EventType(msg) != "OrderPlaced" || outboxkit.PartitionKey(msg) != "o-9" ||
		msg.Metadata.Get(outboxkit.MetadataContentType) != "application/json" {
		t.Fatalf("read %s %v", msg.UUID, msg.Metadata)
	}
	if created, ok := outboxkit.CreatedAt(msg); !ok || !created.Equal(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("created_at %q", msg.Metadata.Get(outboxkit.MetadataCreatedAt))
	}

	// Our own records keep their UUID, and a keyless one does not take its record key as a partition key.
	ours, err := m.Marshal("orders", message.NewMessage("own-uuid", nil))
	if err != nil {
		t.Fatal(err)
	}
	back, err := m.Unmarshal(&sarama.ConsumerMessage{Key: []byte("own-uuid"), Headers: headers(ours.Headers)})
	if err != nil || back.UUID != "own-uuid" || outboxkit.PartitionKey(back) != "" {
		t.Fatalf("own record read back as %s %v (%v)", back.UUID, back.Metadata, err)
	}
}

func headers(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	out := make([]*sarama.RecordHeader, len(hs))
	for i := range hs {
		out[i] = &hs[i]
	}
	return out
}

func TestAMQP_PropertiesAndForeignDeliveries(t *testing.T) {
	p, err := NewAMQPPublisher(AMQPConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", CloudEvents: true, CloudEventsSource: "/orders"})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := p.marshaler.Marshal(relayed())
	if err != nil {
		t.Fatal(err)
	}
	p.properties("orders", relayed(), &pub)
	if pub.MessageId != "0192-uuid" || pub.Type != "OrderPlaced" || pub.ContentType != "application/json" ||
		!pub.Timestamp.Equal(time.Date(2026, 11, 30, 10, 0, 0, 5e8, time.UTC)) {
		t.Fatalf("properties: id %q type %q content %q timestamp %s", pub.MessageId, pub.Type, pub.ContentType, pub.Timestamp)
	}
	if pub.Headers["cloudEvents:id"] != "0192-uuid" || pub.Headers["cloudEvents:source"] != "/orders" ||
		pub.Headers["cloudEvents:partitionkey"] != "o-1" {
		t.Fatalf("CloudEvents application properties: %v", pub.Headers)
	}

	s, err := NewAMQPSubscriber(AMQPSubscriberConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", ConsumerGroup: "g"})
	if err != nil {
		t.Fatal(err)
	}
	// A Node.js producer that sets only messageId, type and contentType.
	plain, err := s.unmarshal(amqp.Delivery{MessageId: "node-1", Type: "OrderPlaced", ContentType: "application/json", Body: []byte(`{}`)})
	if err != nil || plain.UUID != "node-1" || outboxkit.EventType(plain) != "OrderPlaced" {
		t.Fatalf("plain delivery read as %s %v (%v)", plain.UUID, plain.Metadata, err)
	}
	// A CloudEvents SDK producer, binary mode.
	ce, err := s.unmarshal(amqp.Delivery{Headers: amqp.Table{"cloudEvents:id": "ce-1", "cloudEvents:type": "OrderPaid",
		"cloudEvents:partitionkey": "o-2", "cloudEvents:specversion": "1.0"}, Body: []byte(`{}`)})
	if err != nil || ce.UUID != "ce-1" || outboxkit.EventType(ce) != "OrderPaid" || outboxkit.PartitionKey(ce) != "o-2" {
		t.Fatalf("CloudEvent read as %s %v (%v)", ce.UUID, ce.Metadata, err)
	}
}

func TestRedisMarshaller_ReadsAForeignEntry(t *testing.T) {
	m := redisMarshaller{wire: newWireFormat(Options{CloudEvents: true})}
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
