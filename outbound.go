package outboxkit

import "github.com/google/uuid"

// OutboundKeySpace is the UUID namespace of OutboundKey.
var OutboundKeySpace = uuid.MustParse("6f1c3b52-8f0e-4d5a-9a57-3c2d7e1b4a90")

// OutboundKey is the idempotency key a consumer sends with an effect outside its database — a
// charge at a payment gateway, an e-mail, a call to another service — so that the other side
// deduplicates the call when the message is delivered again (a crash after the call and before
// the inbox commit, a redelivery, an operator's replay: they all carry the same message UUID).
//
// It is the name-based UUID (version 5, SHA-1) of consumer, a NUL byte and the message UUID in
// OutboundKeySpace: 36 characters of [0-9a-f-], safe as an HTTP Idempotency-Key header, the same
// for every delivery of one message to one consumer, different for each consumer, and computable
// in any language:
//
//	uuid5(6f1c3b52-8f0e-4d5a-9a57-3c2d7e1b4a90, consumer + "\x00" + messageUUID)
//
// Inside the consumer stack, middleware.OutboundKey reads both from the handler's context.
func OutboundKey(consumer, messageUUID string) string {
	return uuid.NewSHA1(OutboundKeySpace, []byte(consumer+"\x00"+messageUUID)).String()
}
