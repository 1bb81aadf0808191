package kafkabackend

import (
	"errors"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// kafkaUUIDHeader is the record header watermill-kafka keeps a message's UUID in
// (kafka.UUIDHeaderKey): the other headers are the message's metadata, the value its payload.
const kafkaUUIDHeader = "_watermill_message_uuid"

// kafkaKey keys each message by its partition key, so one aggregate stays on one partition, in
// order. A message without a key gets its UUID, which spreads keyless messages over partitions.
func kafkaKey(msg *message.Message) string {
	if k := outboxkit.PartitionKey(msg); k != "" {
		return k
	}
	return msg.UUID
}

// kafkaMarshaler writes and reads records in watermill-kafka's format (its DefaultMarshaler, keyed
// as its NewWithPartitioningMarshaler keys), with the CloudEvents Kafka binding's headers when
// asked for, and reads a CloudEvent another producer wrote.
type kafkaMarshaler struct {
	wire brokerio.Wire
}

// marshalRecord is msg as a record of topic: the UUID header first, then the metadata (sorted by
// name, so that a record is written the same way each time), then the CloudEvents attributes.
func (m kafkaMarshaler) marshalRecord(topic string, msg *message.Message) (*kgo.Record, error) {
	if msg.Metadata.Get(kafkaUUIDHeader) != "" {
		return nil, errors.New("metadata " + kafkaUUIDHeader + " is reserved by watermill for message UUID")
	}
	names := make([]string, 0, len(msg.Metadata))
	for name := range msg.Metadata {
		names = append(names, name)
	}
	slices.Sort(names)
	headers := make([]kgo.RecordHeader, 0, 1+len(names))
	headers = append(headers, kgo.RecordHeader{Key: kafkaUUIDHeader, Value: []byte(msg.UUID)})
	for _, name := range names {
		headers = append(headers, kgo.RecordHeader{Key: name, Value: []byte(msg.Metadata[name])})
	}
	for name, v := range m.wire.CEAttributes(topic, msg) {
		key := brokerio.CEPrefixKafka + name
		if name == "datacontenttype" {
			key = brokerio.CEContentType
		}
		headers = append(headers, kgo.RecordHeader{Key: key, Value: []byte(v)})
	}
	return &kgo.Record{Topic: topic, Key: []byte(kafkaKey(msg)), Value: msg.Payload, Headers: headers}, nil
}

// unmarshalRecord reads a record: watermill-kafka's format, or a CloudEvent in the Kafka binding's
// binary mode (no UUID header), whose partition key is the record key.
func (m kafkaMarshaler) unmarshalRecord(r *kgo.Record) *message.Message {
	var id string
	metadata := make(message.Metadata, len(r.Headers))
	for _, h := range r.Headers {
		if h.Key == kafkaUUIDHeader {
			id = string(h.Value)
		} else {
			metadata.Set(h.Key, string(h.Value))
		}
	}
	msg := message.NewMessage(id, r.Value)
	msg.Metadata = metadata
	foreign := id == ""
	attrs := brokerio.MetadataAttrs(msg.Metadata, brokerio.CEPrefixKafka, brokerio.CEContentType)
	brokerio.AdoptForeign(msg, func(name string) string {
		if v := attrs(name); v != "" || name != "partitionkey" || !foreign {
			return v
		}
		return string(r.Key) // the binding maps the partition key to the record key
	})
	return msg
}
