package kafkabackend

import (
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// kafkaKey keys each message by its partition key, so one aggregate stays on one partition, in
// order. A message without a key gets its UUID, which spreads keyless messages over partitions.
func kafkaKey(_ string, msg *message.Message) (string, error) {
	if k := outboxkit.PartitionKey(msg); k != "" {
		return k, nil
	}
	return msg.UUID, nil
}

// kafkaMarshaler is watermill-kafka's format, keyed by partition key, with the CloudEvents Kafka
// binding's headers when asked for, and able to read a CloudEvent another producer wrote.
type kafkaMarshaler struct {
	inner kafka.MarshalerUnmarshaler
	wire  brokerio.Wire
}

func (m kafkaMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := m.inner.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	for name, v := range m.wire.CEAttributes(topic, msg) {
		key := brokerio.CEPrefixKafka + name
		if name == "datacontenttype" {
			key = brokerio.CEContentType
		}
		pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(key), Value: []byte(v)})
	}
	return pm, nil
}

func (m kafkaMarshaler) Unmarshal(cm *sarama.ConsumerMessage) (*message.Message, error) {
	msg, err := m.inner.Unmarshal(cm)
	if err != nil {
		return nil, err
	}
	foreign := msg.UUID == ""
	attrs := brokerio.MetadataAttrs(msg.Metadata, brokerio.CEPrefixKafka, brokerio.CEContentType)
	brokerio.AdoptForeign(msg, func(name string) string {
		if v := attrs(name); v != "" || name != "partitionkey" || !foreign {
			return v
		}
		return string(cm.Key) // the binding maps the partition key to the record key
	})
	return msg, nil
}

// decode reads a record in watermill-kafka's format; one that can never be read is handed out as
// it came, for the consumer to dead-letter.
func (c *kafkaConsumer) decode(r *kgo.Record) *message.Message {
	cm := &sarama.ConsumerMessage{Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Timestamp: r.Timestamp, Headers: make([]*sarama.RecordHeader, len(r.Headers))}
	for i := range r.Headers {
		cm.Headers[i] = &sarama.RecordHeader{Key: []byte(r.Headers[i].Key), Value: r.Headers[i].Value}
	}
	msg, err := c.s.marshaler.Unmarshal(cm)
	if err == nil {
		return msg
	}
	logs.Warn(c.s.logger, "Cannot read a Kafka record, handing it out to be dead-lettered", err,
		c.fields.Add(watermill.LogFields{"partition": r.Partition, "offset": r.Offset}))
	headers := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	return brokerio.Undecodable(fmt.Sprintf("Kafka record %s/%d offset %d", r.Topic, r.Partition, r.Offset), err, r.Value, headers, kafka.UUIDHeaderKey)
}
