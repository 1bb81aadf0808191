// Package outboxmsg turns Watermill messages into outbox rows: it validates what every store can
// keep, and stores the writer's trace context with the row.
package outboxmsg

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/tracing"
	"github.com/outboxkit/outboxkit/store"
)

// MaxFieldBytes bounds the topic, UUID and partition key. Brokers limit them far below this (AMQP
// short strings are 255 bytes); the bound catches a payload passed as a key by mistake.
const MaxFieldBytes = 255

// InvalidError says why a message cannot be stored in the outbox. Nothing is written when it is
// returned.
type InvalidError struct {
	Index  int    // position of the message in the Publish call
	UUID   string // the message's UUID, possibly empty
	Reason string
	// Err is the sentinel the error wraps, if any (store.ErrDuplicateUUID for a UUID repeated
	// within the call).
	Err error
}

func (e *InvalidError) Unwrap() error { return e.Err }

func (e *InvalidError) Error() string {
	return fmt.Sprintf("outbox publish: message %d (uuid %q): %s", e.Index, e.UUID, e.Reason)
}

// Rows validates msgs for topic and returns them as outbox rows.
func Rows(topic string, msgs []*message.Message) ([]store.OutboxMessage, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	out := make([]store.OutboxMessage, len(msgs))
	var seen map[string]int // for long calls; short ones compare in place, without allocating
	for i, msg := range msgs {
		row, err := toRow(i, topic, msg)
		if err != nil {
			return nil, err
		}
		first := -1
		switch {
		case len(msgs) <= 16:
			for j := range i {
				if out[j].UUID == row.UUID {
					first = j
					break
				}
			}
		default:
			if seen == nil {
				seen = make(map[string]int, len(msgs))
			}
			if j, dup := seen[row.UUID]; dup {
				first = j
			}
			seen[row.UUID] = i
		}
		if first >= 0 {
			return nil, &InvalidError{Index: i, UUID: row.UUID, Err: store.ErrDuplicateUUID,
				Reason: fmt.Sprintf("the same UUID as message %d of this call: every message needs its own UUID", first)}
		}
		out[i] = row
	}
	return out, nil
}

func toRow(i int, topic string, msg *message.Message) (store.OutboxMessage, error) {
	if msg == nil {
		return store.OutboxMessage{}, &InvalidError{Index: i, Reason: "message is nil"}
	}
	invalid := func(format string, a ...any) error {
		return &InvalidError{Index: i, UUID: msg.UUID, Reason: fmt.Sprintf(format, a...)}
	}
	if msg.UUID == "" {
		return store.OutboxMessage{}, invalid("empty UUID: give every message a unique id (pipeline.NewEvent does), " +
			"it is the identity consumers deduplicate on")
	}
	if reason := checkText(msg.UUID); reason != "" {
		return store.OutboxMessage{}, invalid("UUID %s", reason)
	}
	if len(msg.UUID) > MaxFieldBytes {
		return store.OutboxMessage{}, invalid("UUID is %d bytes; at most %d", len(msg.UUID), MaxFieldBytes)
	}
	for k, v := range msg.Metadata {
		if k == "" {
			return store.OutboxMessage{}, invalid("metadata has an empty key")
		}
		if reason := checkText(k); reason != "" {
			return store.OutboxMessage{}, invalid("metadata key %q %s", k, reason)
		}
		if reason := checkText(v); reason != "" {
			return store.OutboxMessage{}, invalid("metadata %q value %s", k, reason)
		}
	}
	key := outboxkit.PartitionKey(msg)
	if len(key) > MaxFieldBytes {
		return store.OutboxMessage{}, invalid("partition key is %d bytes; at most %d", len(key), MaxFieldBytes)
	}
	md := msg.Metadata
	// The writer's trace context travels with the row (W3C traceparent/tracestate), so the relay
	// can link its publish to the request and the consumers can continue its trace. The partition
	// key does not: it has a column of its own, which the forwarder puts back into the metadata it
	// publishes, so the row does not carry it twice (every byte of the row is written, logged and
	// replicated inside the caller's transaction). The caller's message stays as it was given: the
	// trace context goes into a copy, and the key is skipped as the JSON is written.
	if !tracing.Has(md) && trace.SpanContextFromContext(msg.Context()).IsValid() {
		row := make(message.Metadata, len(md)+2)
		for k, v := range md {
			row[k] = v
		}
		tracing.Inject(msg.Context(), row)
		md = row
	}
	return store.OutboxMessage{UUID: msg.UUID, Topic: topic, PartitionKey: key, Payload: msg.Payload,
		Metadata: metadataJSON(md, key != "")}, nil
}

// metadataJSON is md, less its partition key when withoutKey, as encoding/json writes a map[string]string:
// keys in byte order, strings escaped alike (HTML characters and U+2028/U+2029 included). It is
// written here because encoding/json spends most of what building an outbox row costs the
// caller's transaction on reflection, and at one client every microsecond of the writer's is in
// the transaction's latency. The entries are valid UTF-8 without NUL (toRow checked them).
func metadataJSON(md message.Metadata, withoutKey bool) []byte {
	var buf [8]string // the keys of a usual message's metadata, without allocating
	keys := buf[:0]
	size := 2
	for k, v := range md {
		if !withoutKey || k != outboxkit.MetadataPartitionKey {
			keys = append(keys, k)
			size += len(k) + len(v) + 6
		}
	}
	if len(keys) == 0 {
		return []byte("{}")
	}
	slices.Sort(keys)
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, k := range keys {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendJSONString(out, k)
		out = append(out, ':')
		out = appendJSONString(out, md[k])
	}
	return append(out, '}')
}

// appendJSONString appends s quoted as encoding/json quotes a string with HTML escaping, for valid
// UTF-8.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b >= utf8.RuneSelf {
			// U+2028 and U+2029 (E2 80 A8/A9), which JavaScript does not take in a string literal.
			if b == 0xe2 && i+2 < len(s) && s[i+1] == 0x80 && s[i+2]&^1 == 0xa8 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[s[i+2]&0xf])
				i += 3
				start = i
				continue
			}
			i++
			continue
		}
		if b >= ' ' && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch b {
		case '"', '\\':
			dst = append(dst, '\\', b)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func validateTopic(topic string) error {
	if topic == "" {
		return errors.New("outbox publish: empty topic: name the topic the event goes to, e.g. \"orders\"")
	}
	if reason := checkText(topic); reason != "" {
		return fmt.Errorf("outbox publish: topic %q %s", topic, reason)
	}
	if len(topic) > MaxFieldBytes {
		return fmt.Errorf("outbox publish: topic is %d bytes; at most %d", len(topic), MaxFieldBytes)
	}
	return nil
}

// checkText reports why s cannot be stored as text, or "" when it can. Postgres rejects NUL in
// text and JSON; encoding/json would silently replace invalid UTF-8.
func checkText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which the store cannot keep in text"
	}
	return ""
}
