package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

func TestClassifyKafka_OutageIsUnreachableRefusalIsNot(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("cannot produce message 0192: %w", err) }
	for _, err := range []error{
		wrap(breaker.ErrBreakerOpen), // Sarama's breaker, seen during an outage
		wrap(sarama.ErrOutOfBrokers), wrap(io.EOF), wrap(syscall.ECONNRESET),
		wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		wrap(sarama.ErrNotLeaderForPartition),
	} {
		if !outboxkit.IsUnreachable(classifyKafka(err)) {
			t.Errorf("%v: a message error, want an unreachable error", err)
		}
	}
	for _, err := range []error{wrap(sarama.ErrMessageSizeTooLarge), wrap(sarama.ErrInvalidTopic), errors.New("marshal: bad key"),
		wrap(sarama.Wrap(sarama.ErrMessageSizeTooLarge, errors.New("the broker's message")))} {
		if outboxkit.IsUnreachable(classifyKafka(err)) {
			t.Errorf("%v: an unreachable error, want a message error (the message is refused)", err)
		}
	}
	// A refusal of the client, as Sarama returns it bare and wrapped with the broker's message.
	for _, err := range []error{wrap(sarama.ErrTopicAuthorizationFailed),
		wrap(sarama.Wrap(sarama.ErrSASLAuthenticationFailed, errors.New("Authentication failed: Invalid username or password")))} {
		if got := classifyKafka(err); !outboxkit.IsAccessDenied(got) || outboxkit.IsUnreachable(got) {
			t.Errorf("%v: classified %v, want an access-denied error only", err, got)
		}
	}
}

// A record kcat or another SDK wrote in the Kafka binding's binary mode: no Watermill UUID header.
func TestKafkaMarshaler_ReadsAForeignCloudEvent(t *testing.T) {
	m := kafkaMarshaler{inner: kafka.NewWithPartitioningMarshaler(kafkaKey), wire: brokerio.NewWire(backends.Options{})}
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
