package brokerio

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/dbtext"
)

// Undecodable is what a subscriber hands out for a broker message it cannot read: a message
// without a UUID that carries the payload as it came and the headers (or fields) as metadata, and
// under outboxkit.MetadataUndecodable the error and where the message stood in the broker (where:
// "Redis stream entry 1700000000000-0 of orders"). The consumer's stack dead-letters it on its
// first delivery, with that reason, under "no-id:" and a digest, and the subscriber then
// acknowledges it as any other: a malformed message is set aside for an operator, never dropped
// and never redelivered for ever in front of the messages behind it. A replay sends it back with
// the dead letter's id, and it is handled as any other message.
//
// idKey names the header or field where the wire format keeps Watermill's UUID: its value is
// quoted in the reason rather than kept in the metadata, where the replay's publisher would refuse
// it (or write it over the replay's id).
func Undecodable(where string, err error, payload []byte, headers map[string]string, idKey string) *message.Message {
	msg := message.NewMessage("", payload)
	msg.Metadata = make(message.Metadata, len(headers)+1)
	for k, v := range headers {
		if k == idKey {
			where += fmt.Sprintf(" (%s %q)", k, v)
			continue
		}
		msg.Metadata.Set(dbtext.Storable(k), dbtext.Storable(v)) // stored as JSON text with the dead letter
	}
	msg.Metadata.Set(outboxkit.MetadataUndecodable, dbtext.Storable(fmt.Sprintf("cannot read %s: %v", where, err)))
	return msg
}
