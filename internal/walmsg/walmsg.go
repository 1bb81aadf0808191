// Package walmsg is the envelope of an outbox event written to Postgres's write-ahead log as a
// logical decoding message (pg_logical_emit_message) instead of an outbox row: the writers of a
// store in WAL mode encode it, the log relay (forwarder/pglog) decodes it.
//
// Layout: a version byte (1), then the message id, the topic, the partition key and the metadata,
// each as a uvarint length and its bytes, then the payload to the end.
package walmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const version = 1

// Prefix is the logical decoding message prefix of the outbox in schema: the relay reads the
// messages with it and ignores the others.
func Prefix(schema string) string { return "outboxkit:" + schema }

// Envelope is one event.
type Envelope struct {
	UUID         string
	Topic        string
	PartitionKey string
	Metadata     []byte
	Payload      []byte
}

// Encode lays e out.
func Encode(e Envelope) []byte {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen32+len(e.UUID)+len(e.Topic)+len(e.PartitionKey)+len(e.Metadata)+len(e.Payload))
	b = append(b, version)
	for _, f := range [][]byte{[]byte(e.UUID), []byte(e.Topic), []byte(e.PartitionKey), e.Metadata} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return append(b, e.Payload...)
}

// Decode reads an envelope Encode laid out; it refuses anything else.
func Decode(b []byte) (Envelope, error) {
	var e Envelope
	if len(b) == 0 || b[0] != version {
		return e, errors.New("not an outboxkit event envelope (unknown version byte)")
	}
	b = b[1:]
	fields := make([][]byte, 4)
	for i := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return e, fmt.Errorf("outboxkit event envelope cut short in field %d", i+1)
		}
		fields[i], b = b[k:k+int(n)], b[k+int(n):]
	}
	e.UUID, e.Topic, e.PartitionKey, e.Metadata, e.Payload = string(fields[0]), string(fields[1]), string(fields[2]), fields[3], b
	if e.UUID == "" || e.Topic == "" {
		return e, errors.New("outboxkit event envelope without message id or topic")
	}
	return e, nil
}
