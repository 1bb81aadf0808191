package amqpbackend

import (
	"strings"
	"testing"
	"time"

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

func TestAMQP_PropertiesAndForeignDeliveries(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", CloudEvents: true, CloudEventsSource: "/orders"})
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

	s, err := NewSubscriber(SubscriberConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", Consumer: "g"})
	if err != nil {
		t.Fatal(err)
	}
	// A Node.js producer that sets only messageId, type and contentType.
	plain := s.unmarshal(amqp.Delivery{MessageId: "node-1", Type: "OrderPlaced", ContentType: "application/json", Body: []byte(`{}`)}, nil)
	if plain.UUID != "node-1" || outboxkit.EventType(plain) != "OrderPlaced" {
		t.Fatalf("plain delivery read as %s %v", plain.UUID, plain.Metadata)
	}
	// A CloudEvents SDK producer, binary mode.
	ce := s.unmarshal(amqp.Delivery{Headers: amqp.Table{"cloudEvents:id": "ce-1", "cloudEvents:type": "OrderPaid",
		"cloudEvents:partitionkey": "o-2", "cloudEvents:specversion": "1.0"}, Body: []byte(`{}`)}, nil)
	if ce.UUID != "ce-1" || outboxkit.EventType(ce) != "OrderPaid" || outboxkit.PartitionKey(ce) != "o-2" {
		t.Fatalf("CloudEvent read as %s %v", ce.UUID, ce.Metadata)
	}
	// Watermill's UUID header holding a number: handed out as it came, marked undecodable.
	bad := s.unmarshal(amqp.Delivery{MessageId: "m-7", Headers: amqp.Table{"_watermill_message_uuid": int32(7)}, Body: []byte(`{}`)}, nil)
	why := bad.Metadata.Get(outboxkit.MetadataUndecodable)
	if bad.UUID != "" || string(bad.Payload) != `{}` || bad.Metadata["_watermill_message_uuid"] != "" ||
		!strings.Contains(why, `"m-7"`) || !strings.Contains(why, `_watermill_message_uuid "7"`) {
		t.Fatalf("undecodable delivery read as %q %s %v", bad.UUID, bad.Payload, bad.Metadata)
	}
}
