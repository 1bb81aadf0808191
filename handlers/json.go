package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Func is a typed handler: it makes its effect for event through tx. MessageFrom(ctx) gives it the
// message itself: its UUID, its metadata (event type, partition key, version, trace context).
type Func[T any] func(ctx context.Context, tx pgx.Tx, event T) error

// Decoder turns a payload into a T.
type Decoder[T any] func(payload []byte, into *T) error

// ErrNoTx is returned (as a permanent error) when a typed handler runs without the inbox
// middleware, which owns the transaction.
var ErrNoTx = errors.New("no transaction in the message context: put the inbox middleware in front of this handler")

// JSON turns fn into a Watermill handler that decodes the payload as JSON into a T. A payload that
// does not decode is a permanent error: quarantined at once, never retried.
func JSON[T any](fn Func[T]) message.NoPublishHandlerFunc {
	return Decoded(func(payload []byte, into *T) error { return json.Unmarshal(payload, into) }, fn)
}

// Decoded is JSON with a decoder of your choice (protobuf, Avro…). A decode error is permanent.
func Decoded[T any](decode Decoder[T], fn Func[T]) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := TxFrom(ctx)
		if !ok {
			return Permanent(ErrNoTx)
		}
		var event T
		if err := decode(msg.Payload, &event); err != nil {
			return Permanent(fmt.Errorf("decode message %s as %T: %w", msg.UUID, event, err))
		}
		return fn(context.WithValue(ctx, messageKey{}, msg), tx, event)
	}
}

type messageKey struct{}

// MessageFrom returns the message a typed handler (JSON, Decoded) is handling: its UUID, metadata
// and payload, as the subscriber handed it over. ok is false outside a typed handler.
func MessageFrom(ctx context.Context) (msg *message.Message, ok bool) {
	msg, ok = ctx.Value(messageKey{}).(*message.Message)
	return msg, ok
}
