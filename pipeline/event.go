package pipeline

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit"
)

// NewEvent builds a message for the outbox: a fresh time-ordered UUID (version 7, which keeps the
// outbox's and the inboxes' unique indexes append-mostly), the event type and the partition key
// (the aggregate id; "" for an event that needs no ordering) in metadata.
func NewEvent(eventType, partitionKey string, payload []byte) *message.Message {
	msg := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
	if eventType != "" {
		outboxkit.SetEventType(msg, eventType)
	}
	if partitionKey != "" {
		outboxkit.SetPartitionKey(msg, partitionKey)
	}
	return msg
}

// NewJSONEvent is NewEvent with v encoded as JSON, and its content type (outboxkit.MetadataContentType)
// application/json.
func NewJSONEvent(eventType, partitionKey string, v any) (*message.Message, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s event as JSON: %w", eventType, err)
	}
	msg := NewEvent(eventType, partitionKey, payload)
	msg.Metadata.Set(outboxkit.MetadataContentType, "application/json")
	return msg, nil
}
