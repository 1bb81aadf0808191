package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

func TestClassifyKafka_OutageIsUnreachableRefusalIsNot(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("kafka publisher: publish to orders: %w", err) }
	for _, err := range []error{
		wrap(kgo.ErrRecordTimeout), wrap(kgo.ErrRecordRetries), wrap(kgo.ErrClientClosed),
		wrap(io.EOF), wrap(syscall.ECONNRESET), wrap(&kgo.ErrFirstReadEOF{}),
		wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		wrap(kerr.NotLeaderForPartition), wrap(kerr.UnknownTopicOrPartition), wrap(context.DeadlineExceeded),
	} {
		if got := classifyKafka(err); !outboxkit.IsUnreachable(got) || outboxkit.IsPermanent(got) {
			t.Errorf("%v: classified %v, want an unreachable error", err, got)
		}
	}
	for _, err := range []error{wrap(kerr.MessageTooLarge), wrap(kerr.InvalidTopicException), wrap(kerr.InvalidRecord),
		wrap(kerr.CorruptMessage), wrap(kerr.RecordListTooLarge)} {
		if got := classifyKafka(err); !outboxkit.IsPermanent(got) || outboxkit.IsUnreachable(got) {
			t.Errorf("%v: classified %v, want a permanent error (the message is refused for good)", err, got)
		}
	}
	if got := classifyKafka(errors.New("marshal: bad key")); outboxkit.IsUnreachable(got) || outboxkit.IsAccessDenied(got) {
		t.Errorf("a marshalling error classified %v, want it left a message error", got)
	}
	for _, err := range []error{wrap(kerr.TopicAuthorizationFailed), wrap(kerr.SaslAuthenticationFailed),
		wrap(fmt.Errorf("SASL authentication failed: %w", kerr.SaslAuthenticationFailed))} {
		if got := classifyKafka(err); !outboxkit.IsAccessDenied(got) || outboxkit.IsUnreachable(got) {
			t.Errorf("%v: classified %v, want an access-denied error only", err, got)
		}
	}
}

// Records are written as watermill-kafka's DefaultMarshaler writes them: the UUID header first, the
// metadata as headers, the payload as the value, the partition key (or else the UUID) as the key.
func TestKafkaMarshaler_WritesWatermillKafkasFormat(t *testing.T) {
	m := kafkaMarshaler{wire: brokerio.NewWire(backends.Options{})}
	msg := message.NewMessage("uuid-1", []byte(`{"n":1}`))
	msg.Metadata.Set(outboxkit.MetadataPartitionKey, "order-7")
	msg.Metadata.Set("b", "2")
	r, err := m.marshalRecord("orders", msg)
	if err != nil {
		t.Fatal(err)
	}
	want := []kgo.RecordHeader{{Key: kafkaUUIDHeader, Value: []byte("uuid-1")}, {Key: "b", Value: []byte("2")},
		{Key: outboxkit.MetadataPartitionKey, Value: []byte("order-7")}}
	if r.Topic != "orders" || string(r.Key) != "order-7" || string(r.Value) != `{"n":1}` || !reflect.DeepEqual(r.Headers, want) {
		t.Fatalf("record %s key %q value %q headers %v; want headers %v", r.Topic, r.Key, r.Value, r.Headers, want)
	}
	if r, err := m.marshalRecord("orders", message.NewMessage("uuid-2", nil)); err != nil || string(r.Key) != "uuid-2" {
		t.Fatalf("a keyless message keyed %q (%v); want its UUID", r.Key, err)
	}
	bad := message.NewMessage("uuid-3", nil)
	bad.Metadata.Set(kafkaUUIDHeader, "x")
	if _, err := m.marshalRecord("orders", bad); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("metadata named like the UUID header: %v; want it refused", err)
	}
}

// A record kcat or another SDK wrote in the Kafka binding's binary mode: no Watermill UUID header.
func TestKafkaMarshaler_ReadsAForeignCloudEvent(t *testing.T) {
	m := kafkaMarshaler{wire: brokerio.NewWire(backends.Options{})}
	rec := &kgo.Record{Key: []byte("o-9"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{
		{Key: "ce_id", Value: []byte("evt-1")}, {Key: "ce_type", Value: []byte("OrderPlaced")},
		{Key: "ce_source", Value: []byte("/node")}, {Key: "ce_specversion", Value: []byte("1.0")},
		{Key: "ce_time", Value: []byte("2026-11-30T10:00:00Z")}, {Key: "content-type", Value: []byte("application/json")},
	}}
	msg := m.unmarshalRecord(rec)
	if msg.UUID != "evt-1" || outboxkit.EventType(msg) != "OrderPlaced" || outboxkit.PartitionKey(msg) != "o-9" ||
		msg.Metadata.Get(outboxkit.MetadataContentType) != "application/json" {
		t.Fatalf("read %s %v", msg.UUID, msg.Metadata)
	}
	if created, ok := outboxkit.CreatedAt(msg); !ok || !created.Equal(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("created_at %q", msg.Metadata.Get(outboxkit.MetadataCreatedAt))
	}

	// Our own records keep their UUID, and a keyless one does not take its record key as a partition key.
	ours, err := m.marshalRecord("orders", message.NewMessage("own-uuid", nil))
	if err != nil {
		t.Fatal(err)
	}
	back := m.unmarshalRecord(ours)
	if back.UUID != "own-uuid" || outboxkit.PartitionKey(back) != "" {
		t.Fatalf("own record read back as %s %v", back.UUID, back.Metadata)
	}
}

func TestOpen_RefusesAnInstanceIDKafkaWouldRefuse(t *testing.T) {
	_, err := backends.Open(context.Background(), "kafka://127.0.0.1:9092", backends.Options{KafkaInstanceID: "billing 0"})
	if err == nil || !strings.Contains(err.Error(), `KafkaInstanceID "billing 0"`) {
		t.Fatalf("Open = %v; want an error naming KafkaInstanceID and what it takes", err)
	}
	b, err := backends.Open(context.Background(), "kafka://127.0.0.1:9092", backends.Options{KafkaInstanceID: "billing-0", Unacked: 100})
	if err != nil {
		t.Fatalf("a good instance id and Unacked refused: %v", err)
	}
	_ = b.Close()
}
