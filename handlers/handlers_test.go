package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
)

// fakeTx stands in for the inbox's transaction, of the store driver's type: the handlers only pass
// it through.
type fakeTx struct{ _ int }

type order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func msgWithTx(payload string, tx any) *message.Message {
	m := message.NewMessage("m-1", []byte(payload))
	if tx != nil {
		m.SetContext(outboxkit.WithTx(context.Background(), tx))
	}
	return m
}

func TestJSON_DecodesAndPassesTheInboxTx(t *testing.T) {
	tx := &fakeTx{}
	var got order
	var gotTx *fakeTx
	h := handlers.JSON(func(_ context.Context, tx *fakeTx, o order) error { got, gotTx = o, tx; return nil })
	if err := h(msgWithTx(`{"id":"o-1","total":42}`, tx)); err != nil {
		t.Fatal(err)
	}
	if got != (order{ID: "o-1", Total: 42}) || gotTx != tx {
		t.Fatalf("handler got %+v with tx %p, want o-1/42 with %p", got, gotTx, tx)
	}
}

func TestJSON_HandlerSeesTheMessage(t *testing.T) {
	msg := msgWithTx(`{"id":"o-1"}`, &fakeTx{})
	msg.Metadata.Set("outboxkit_event_type", "OrderPlaced")
	var seen *message.Message
	h := handlers.JSON(func(ctx context.Context, _ *fakeTx, _ order) error {
		seen, _ = handlers.MessageFrom(ctx)
		return nil
	})
	if err := h(msg); err != nil {
		t.Fatal(err)
	}
	if seen != msg || seen.UUID != "m-1" || seen.Metadata.Get("outboxkit_event_type") != "OrderPlaced" {
		t.Fatalf("the handler saw %v, want the message with its UUID and metadata", seen)
	}
	if _, ok := handlers.MessageFrom(context.Background()); ok {
		t.Fatal("MessageFrom found a message outside a handler")
	}
}

func TestJSON_UndecodablePayloadIsPermanentAndNeverReachesTheHandler(t *testing.T) {
	called := false
	h := handlers.JSON(func(context.Context, *fakeTx, order) error { called = true; return nil })
	err := h(msgWithTx("not json", &fakeTx{}))
	if !handlers.IsPermanent(err) {
		t.Fatalf("err = %v, want a permanent error", err)
	}
	if called {
		t.Fatal("the handler ran on a payload that did not decode")
	}
	if !strings.Contains(err.Error(), "m-1") || !strings.Contains(err.Error(), "order") {
		t.Fatalf("error %q should name the message and the type it failed to decode into", err)
	}
}

func TestDecoded_WithoutInboxIsPermanentErrNoTx(t *testing.T) {
	h := handlers.Decoded(func([]byte, *order) error { return nil }, func(context.Context, *fakeTx, order) error { return nil })
	err := h(msgWithTx(`{}`, nil))
	if !handlers.IsPermanent(err) || !errors.Is(err, handlers.ErrNoTx) {
		t.Fatalf("err = %v, want permanent ErrNoTx", err)
	}
}

func TestDecoded_UsesTheGivenDecoderAndKeepsHandlerErrorsTransient(t *testing.T) {
	boom := errors.New("effect failed")
	h := handlers.Decoded(func(p []byte, into *order) error { into.ID = strings.ToUpper(string(p)); return nil },
		func(_ context.Context, _ *fakeTx, o order) error {
			if o.ID != "ABC" {
				return fmt.Errorf("decoder not used: %q", o.ID)
			}
			return boom
		})
	err := h(msgWithTx("abc", &fakeTx{}))
	if !errors.Is(err, boom) || handlers.IsPermanent(err) {
		t.Fatalf("err = %v, want the handler's own transient error", err)
	}
}

func TestPermanent(t *testing.T) {
	if handlers.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	cause := errors.New("cause")
	p := handlers.Permanent(cause)
	if !handlers.IsPermanent(p) || !errors.Is(p, cause) {
		t.Fatalf("Permanent(cause) = %v: not permanent or lost its cause", p)
	}
	if handlers.Permanent(p) != p {
		t.Fatal("wrapping a permanent error again should return it unchanged")
	}
	if !handlers.IsPermanent(fmt.Errorf("context: %w", p)) {
		t.Fatal("IsPermanent must see through wrapping")
	}
	if handlers.IsPermanent(cause) {
		t.Fatal("a plain error is not permanent")
	}
}

// A handler written for another driver's transaction type gets an *outboxkit.TxTypeError naming
// both types — a mistake in the program, which the stack holds, not a permanent error of the
// message, which it would dead-letter — and never a nil transaction.
func TestJSON_WrongTransactionTypeSaysWhich(t *testing.T) {
	called := false
	h := handlers.JSON(func(context.Context, *fakeTx, order) error { called = true; return nil })
	err := h(msgWithTx(`{}`, "a transaction of another type"))
	var tte *outboxkit.TxTypeError
	if called || handlers.IsPermanent(err) || !errors.As(err, &tte) || !strings.Contains(err.Error(), "string") ||
		!strings.Contains(err.Error(), "*handlers_test.fakeTx") {
		t.Fatalf("err = %v (handler ran: %v); want an *outboxkit.TxTypeError naming both types", err, called)
	}
	// An interface type (pgx.Tx is one) is named too, not printed as <nil>.
	type txIface interface{ Commit() error }
	hi := handlers.JSON(func(context.Context, txIface, order) error { called = true; return nil })
	if err := hi(msgWithTx(`{}`, "a transaction of another type")); called || !strings.Contains(err.Error(), "txIface") ||
		strings.Contains(err.Error(), "<nil>") {
		t.Fatalf("err = %v; want the interface type named", err)
	}
}
