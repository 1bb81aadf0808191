package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// Func is a typed handler: it makes its effect for event through tx, the inbox's transaction in
// the type of the store's driver (pgx.Tx with store/pgxstore, *sql.Tx with the database/sql
// drivers). MessageFrom(ctx) gives it the message itself: its UUID, its metadata (event type,
// partition key, version, trace context).
type Func[TTx, T any] func(ctx context.Context, tx TTx, event T) error

// Decoder turns a payload into a T.
type Decoder[T any] func(payload []byte, into *T) error

// ErrNoTx is returned (as a permanent error) when a typed handler runs without the inbox
// middleware, which owns the transaction.
var ErrNoTx = errors.New("no transaction in the message context: put the inbox middleware in front of this handler")

// JSON turns fn into a Watermill handler that decodes the payload as JSON into a T. A payload that
// does not decode is a permanent error: dead-lettered at once, never retried.
func JSON[TTx, T any](fn Func[TTx, T]) message.NoPublishHandlerFunc {
	return Decoded(func(payload []byte, into *T) error { return json.Unmarshal(payload, into) }, fn)
}

// Decoded is JSON with a decoder of your choice (protobuf, Avro…). A decode error is permanent.
//
// A handler whose TTx is not the store's transaction type (a pgx.Tx handler behind a database/sql
// store) fails with an *outboxkit.TxTypeError that names both types: a mistake in the program, on
// which the middleware stack holds every message — none is dead-lettered or counted — and logs it
// until the program is fixed.
func Decoded[TTx, T any](decode Decoder[T], fn Func[TTx, T]) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok, err := outboxkit.TxFrom[TTx](ctx)
		switch {
		case err != nil:
			return fmt.Errorf("message %s: %w", msg.UUID, err)
		case !ok:
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
