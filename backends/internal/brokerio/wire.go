// Package brokerio holds what the broker packages share: the CloudEvents wire format, the
// subscription outlets and the retrying subscriber, and the publisher wrappers that classify
// errors, bound a publish by its context and connect on first use. It imports no broker client.
package brokerio

import (
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
)

// Prefixes of CloudEvents attributes in each protocol binding's binary content mode.
const (
	CEPrefixKafka = "ce_"          // Kafka binding: headers; datacontenttype is the content-type header
	CEPrefixAMQP  = "cloudEvents:" // AMQP binding: application properties; datacontenttype is content-type
	CEPrefixNATS  = "ce-"          // NATS binding: headers; datacontenttype is the content-type header
	CEPrefixOther = "ce_"          // no binding (Redis Streams fields, a watermill-sql topic's metadata): Kafka's names
	CEContentType = "content-type"
)

// Wire is what outboxkit puts on the wire beside Watermill's own format, and how it reads
// messages that other producers wrote.
type Wire struct {
	CloudEvents bool
	source      string
	contentType string // for messages whose metadata names none
}

func NewWire(o backends.Options) Wire {
	w := Wire{CloudEvents: o.CloudEvents, source: o.CloudEventsSource, contentType: o.ContentType}
	if w.source == "" {
		w.source = backends.DefaultCloudEventsSource
	}
	return w
}

// MessageContentType is the message's content type: its metadata's, else the configured default.
func (w Wire) MessageContentType(msg *message.Message) string {
	if ct := msg.Metadata.Get(outboxkit.MetadataContentType); ct != "" {
		return ct
	}
	return w.contentType
}

// CEAttributes returns msg's CloudEvents context attributes, by name (without a binding's prefix),
// datacontenttype included; nil unless CloudEvents is on. The type is the event type, or the topic
// for a message without one (the attribute is required).
func (w Wire) CEAttributes(topic string, msg *message.Message) map[string]string {
	if !w.CloudEvents {
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
	if ct := w.MessageContentType(msg); ct != "" {
		attrs["datacontenttype"] = ct
	}
	return attrs
}

// WithCloudEvents returns a copy of msg whose metadata also carries its CloudEvents attributes
// under prefix (and datacontenttype under contentTypeKey when that is not ""), for bindings whose
// marshalers write metadata as headers or fields. msg itself is unchanged.
func (w Wire) WithCloudEvents(topic string, msg *message.Message, prefix, contentTypeKey string) *message.Message {
	attrs := w.CEAttributes(topic, msg)
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

// AdoptForeign completes a message another producer wrote — a CloudEvent in a binding's binary
// mode, or a plain broker message — from what it carries: get returns a CloudEvents attribute by
// name ("" when absent). A message without Watermill's UUID takes the event's id; the event type,
// partition key, time, content type and trace context fill in outboxkit's metadata where it has
// none. A message of outboxkit's own format is left as it is.
func AdoptForeign(msg *message.Message, get func(name string) string) {
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

// MetadataAttrs reads CloudEvents attributes from metadata written under prefix (datacontenttype
// under contentTypeKey when that is not "").
func MetadataAttrs(md message.Metadata, prefix, contentTypeKey string) func(string) string {
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

// MetadataFormat is the wire format of backends without a CloudEvents binding (a watermill-sql
// topic, the in-memory bus): the attributes travel as ce_* metadata.
type MetadataFormat struct {
	message.Publisher
	Wire Wire
}

func (p MetadataFormat) Publish(topic string, msgs ...*message.Message) error {
	if !p.Wire.CloudEvents {
		return p.Publisher.Publish(topic, msgs...)
	}
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = p.Wire.WithCloudEvents(topic, m, CEPrefixOther, "")
	}
	return p.Publisher.Publish(topic, out...)
}
