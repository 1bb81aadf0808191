package backends

import (
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// DefaultCloudEventsSource is the CloudEvents source attribute unless Options.CloudEventsSource
// names another.
const DefaultCloudEventsSource = "/outboxkit"

// Prefixes of CloudEvents attributes in each protocol binding's binary content mode.
const (
	cePrefixKafka = "ce_"          // Kafka binding: headers; datacontenttype is the content-type header
	cePrefixAMQP  = "cloudEvents:" // AMQP binding: application properties; datacontenttype is content-type
	cePrefixNATS  = "ce-"          // NATS binding: headers; datacontenttype is the content-type header
	cePrefixOther = "ce_"          // no binding (Redis Streams fields, a watermill-sql topic's metadata): Kafka's names
	ceContentType = "content-type"
)

// wireFormat is what outboxkit puts on the wire beside Watermill's own format, and how it reads
// messages that other producers wrote.
type wireFormat struct {
	cloudEvents bool
	source      string
	contentType string // for messages whose metadata names none
}

func newWireFormat(o Options) wireFormat {
	w := wireFormat{cloudEvents: o.CloudEvents, source: o.CloudEventsSource, contentType: o.ContentType}
	if w.source == "" {
		w.source = DefaultCloudEventsSource
	}
	return w
}

// messageContentType is the message's content type: its metadata's, else the configured default.
func (w wireFormat) messageContentType(msg *message.Message) string {
	if ct := msg.Metadata.Get(outboxkit.MetadataContentType); ct != "" {
		return ct
	}
	return w.contentType
}

// ceAttributes returns msg's CloudEvents context attributes, by name (without a binding's prefix),
// datacontenttype included; nil unless CloudEvents is on. The type is the event type, or the topic
// for a message without one (the attribute is required).
func (w wireFormat) ceAttributes(topic string, msg *message.Message) map[string]string {
	if !w.cloudEvents {
		return nil
	}
	attrs := map[string]string{"specversion": "1.0", "id": msg.UUID, "source": w.source, "type": outboxkit.EventType(msg)}
	if attrs["type"] == "" {
		attrs["type"] = topic
	}
	if t, ok := outboxkit.CreatedAt(msg); ok {
		attrs["time"] = t.UTC().Format(time.RFC3339Nano)
	}
	if k := outboxkit.PartitionKey(msg); k != "" {
		attrs["partitionkey"] = k // the partitioning extension
	}
	for _, k := range []string{"traceparent", "tracestate"} { // the distributed tracing extension
		if v := msg.Metadata.Get(k); v != "" {
			attrs[k] = v
		}
	}
	if ct := w.messageContentType(msg); ct != "" {
		attrs["datacontenttype"] = ct
	}
	return attrs
}

// withCloudEvents returns a copy of msg whose metadata also carries its CloudEvents attributes
// under prefix (and datacontenttype under contentTypeKey when that is not ""), for bindings whose
// marshalers write metadata as headers or fields. msg itself is unchanged.
func (w wireFormat) withCloudEvents(topic string, msg *message.Message, prefix, contentTypeKey string) *message.Message {
	attrs := w.ceAttributes(topic, msg)
	if attrs == nil {
		return msg
	}
	c := msg.Copy() // with metadata of its own
	c.SetContext(msg.Context())
	for name, v := range attrs {
		if name == "datacontenttype" && contentTypeKey != "" {
			c.Metadata.Set(contentTypeKey, v)
			continue
		}
		c.Metadata.Set(prefix+name, v)
	}
	return c
}

// adoptForeign completes a message another producer wrote — a CloudEvent in a binding's binary
// mode, or a plain broker message — from what it carries: get returns a CloudEvents attribute by
// name ("" when absent). A message without Watermill's UUID takes the event's id; the event type,
// partition key, time, content type and trace context fill in outboxkit's metadata where it has
// none. A message of outboxkit's own format is left as it is.
func adoptForeign(msg *message.Message, get func(name string) string) {
	if msg.UUID == "" {
		msg.UUID = get("id")
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	fill := func(key, v string) {
		if v != "" && msg.Metadata.Get(key) == "" {
			msg.Metadata.Set(key, v)
		}
	}
	fill(outboxkit.MetadataEventType, get("type"))
	fill(outboxkit.MetadataPartitionKey, get("partitionkey"))
	fill(outboxkit.MetadataContentType, get("datacontenttype"))
	if t, err := time.Parse(time.RFC3339Nano, get("time")); err == nil {
		fill(outboxkit.MetadataCreatedAt, t.UTC().Format(time.RFC3339Nano))
	}
	fill("traceparent", get("traceparent"))
	fill("tracestate", get("tracestate"))
}

// metadataAttrs reads CloudEvents attributes from metadata written under prefix (datacontenttype
// under contentTypeKey when that is not "").
func metadataAttrs(md message.Metadata, prefix, contentTypeKey string) func(string) string {
	return func(name string) string {
		if name == "datacontenttype" && contentTypeKey != "" {
			if v := md.Get(contentTypeKey); v != "" {
				return v
			}
		}
		if v := md.Get(prefix + name); v != "" {
			return v
		}
		// Header names are case-insensitive in some bindings' clients.
		for k, v := range md {
			if strings.EqualFold(k, prefix+name) {
				return v
			}
		}
		return ""
	}
}

// metadataFormat is the wire format of backends without a CloudEvents binding (a watermill-sql
// topic, the in-memory bus): the attributes travel as ce_* metadata.
type metadataFormat struct {
	message.Publisher
	wire wireFormat
}

func (p metadataFormat) Publish(topic string, msgs ...*message.Message) error {
	if !p.wire.cloudEvents {
		return p.Publisher.Publish(topic, msgs...)
	}
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = p.wire.withCloudEvents(topic, m, cePrefixOther, "")
	}
	return p.Publisher.Publish(topic, out...)
}
