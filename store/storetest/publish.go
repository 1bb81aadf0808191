package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

func publishTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"BusinessRowAndOutboxRowCommitTogether", commitTogether[TTx]},
		{"StoresWhatTheForwarderNeeds", storesWhatTheForwarderNeeds[TTx]},
		{"BadInputWritesNothing", badInputWritesNothing[TTx]},
		{"DuplicateUUID", duplicateUUID[TTx]},
		{"OneMessageIDAcrossOutboxAndInbox", oneMessageID[TTx]},
		{"FinishedTransaction", finishedTransaction[TTx]},
		{"WithoutMigrationSaysWhatToDo", withoutMigration[TTx]},
		{"SQLWriterMatchesGoWriter", sqlWriterMatchesGo[TTx]},
	}
}

// publishIn publishes msgs in an application transaction after body (the business change).
func publishIn[TTx any](e *Env[TTx], body func(ctx context.Context, tx TTx) error, topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	return e.InTx(ctx, func(tx TTx) error {
		if body != nil {
			if err := body(ctx, tx); err != nil {
				return err
			}
		}
		pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		return pub.Publish(topic, msgs...)
	})
}

// Both the business row and the outbox row commit, or neither does.
func commitTogether[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	e.MustExec(t, `CREATE TABLE {{schema}}.orders (id VARCHAR(64) PRIMARY KEY, total INT)`)
	order := func(id string) func(ctx context.Context, tx TTx) error {
		return func(ctx context.Context, tx TTx) error {
			return e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.orders (id, total) VALUES (?, 10)`, id)
		}
	}
	if err := publishIn(e, order("o-1"), "orders", pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{}`))); err != nil {
		t.Fatalf("first order: %v", err)
	}
	// The business change fails after the event was written: neither survives.
	boom := errors.New("the order's last write failed")
	err := publishIn(e, func(ctx context.Context, tx TTx) error {
		if err := order("o-2")(ctx, tx); err != nil {
			return err
		}
		pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", "o-2", []byte(`{}`))); err != nil {
			return err
		}
		return boom
	}, "orders")
	if !errors.Is(err, boom) {
		t.Fatalf("second order: %v", err)
	}
	// The same order id again: the business insert fails, the event must not survive.
	if err := publishIn(e, order("o-1"), "orders", pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{}`))); err == nil {
		t.Fatal("a duplicate order committed")
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
		t.Fatalf("outbox rows = %d, want 1 (the failed orders' events must not survive)", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.orders`); n != 1 {
		t.Fatalf("orders = %d, want 1", n)
	}
}

func storesWhatTheForwarderNeeds[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	a := pipeline.NewEvent("OrderPlaced", "order-7", []byte{0, 1, 2, 255}) // binary payloads survive
	b := pipeline.NewEvent("OrderPaid", "order-7", nil)
	c := message.NewMessage("plain-uuid", []byte("x")) // no key, no type
	c.Metadata.Set("traceparent", "00-abc-def-01")
	if err := publishIn(e, nil, "orders", a, b, c); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claim, err := e.Store.Claim(ctx, store.ClaimParams{Now: newClock().Now(), Limit: 10, Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Abandon(ctx)
	rows := claim.Rows()
	if len(rows) != 3 || rows[0].UUID != a.UUID || rows[1].UUID != b.UUID || rows[2].UUID != c.UUID {
		t.Fatalf("claimed %+v, want the three messages in order", rows)
	}
	if rows[0].Seq >= rows[1].Seq || rows[1].Seq >= rows[2].Seq {
		t.Fatalf("seqs %d %d %d are not increasing", rows[0].Seq, rows[1].Seq, rows[2].Seq)
	}
	if rows[0].Topic != "orders" || rows[0].PartitionKey != "order-7" || string(rows[0].Payload) != string([]byte{0, 1, 2, 255}) {
		t.Errorf("row 1 = %+v", rows[0])
	}
	if len(rows[1].Payload) != 0 || rows[2].PartitionKey != "" || rows[0].CreatedAt.IsZero() || rows[0].Attempts != 0 {
		t.Errorf("rows 2 and 3 = %+v %+v", rows[1], rows[2])
	}
	var md0, md2 map[string]string
	if err := json.Unmarshal(rows[0].Metadata, &md0); err != nil || md0[outboxkit.MetadataEventType] != "OrderPlaced" {
		t.Errorf("metadata %s (%v) lacks the event type", rows[0].Metadata, err)
	}
	if err := json.Unmarshal(rows[2].Metadata, &md2); err != nil || md2["traceparent"] != "00-abc-def-01" {
		t.Errorf("metadata %s (%v) lost the trace context", rows[2].Metadata, err)
	}
}

func badInputWritesNothing[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	nul := pipeline.NewEvent("E", "k", nil)
	nul.Metadata.Set("note", "a\x00b")
	badUTF8 := pipeline.NewEvent("E", "k", nil)
	badUTF8.Metadata.Set("note", "\xff\xfe")
	for _, c := range []struct {
		name  string
		topic string
		msgs  []*message.Message
		want  string
	}{
		{"empty topic", "", []*message.Message{pipeline.NewEvent("E", "k", nil)}, "empty topic"},
		{"empty uuid", "orders", []*message.Message{message.NewMessage("", nil)}, "empty UUID"},
		{"NUL in metadata", "orders", []*message.Message{nul}, "NUL byte"},
		{"invalid UTF-8 in metadata", "orders", []*message.Message{badUTF8}, "not valid UTF-8"},
		{"second message bad", "orders", []*message.Message{pipeline.NewEvent("E", "k", nil), message.NewMessage("", nil)}, "message 1"},
		{"key too long", "orders", []*message.Message{pipeline.NewEvent("E", strings.Repeat("k", 256), nil)}, "partition key is 256 bytes"},
	} {
		if err := publishIn(e, nil, c.topic, c.msgs...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("outbox rows = %d after rejected publishes, want 0", n)
	}
}

func duplicateUUID[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msg := pipeline.NewEvent("E", "k", nil)
	if err := publishIn(e, nil, "orders", msg); err != nil {
		t.Fatal(err)
	}
	if err := publishIn(e, nil, "orders", msg); !errors.Is(err, pipeline.ErrDuplicateUUID) {
		t.Fatalf("got %v, want ErrDuplicateUUID", err)
	}
	// Repeated within one call: said so, not "already in the outbox", and nothing written.
	twice := pipeline.NewEvent("E", "k", nil)
	err := publishIn(e, nil, "orders", twice, pipeline.NewEvent("E", "k", nil), twice)
	var invalid *pipeline.InvalidMessageError
	if !errors.Is(err, pipeline.ErrDuplicateUUID) || !errors.As(err, &invalid) || invalid.Index != 2 ||
		!strings.Contains(err.Error(), "the same UUID as message 0 of this call") {
		t.Fatalf("a UUID twice in one call: got %v, want an InvalidMessageError for message 2 wrapping ErrDuplicateUUID", err)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE uuid = ?`, twice.UUID); n != 0 {
		t.Fatalf("%d rows written by the refused call", n)
	}
}

func finishedTransaction[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	ctx := context.Background()
	var none TTx
	if _, err := pipeline.NewPublisher(e.Store, none, pipeline.PublisherConfig{}); err == nil || !strings.Contains(err.Error(), "tx is a nil") {
		t.Errorf("NewPublisher with a nil transaction: %v, want it refused", err)
	}
	for _, finish := range []string{"rollback", "commit"} {
		tx, err := e.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if finish == "rollback" {
			err = e.Rollback(ctx, tx)
		} else {
			err = e.Commit(ctx, tx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil)); !errors.Is(err, pipeline.ErrTxDone) {
			t.Errorf("after %s: got %v, want ErrTxDone", finish, err)
		}
	}
	// After a failed statement: Postgres has aborted the transaction (ErrTxAborted, nothing
	// written); MySQL and SQLite carry on.
	tx, err := e.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.ExecTx(ctx, tx, `SELECT * FROM {{schema}}.no_such_table`)
	pub, _ := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
	if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil)); err != nil && !errors.Is(err, pipeline.ErrTxAborted) {
		t.Errorf("after a failed statement: got %v, want success or ErrTxAborted", err)
	}
	_ = e.Rollback(ctx, tx)
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("outbox rows = %d, want 0", n)
	}
}

func withoutMigration[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	err := publishIn(e, nil, "orders", pipeline.NewEvent("E", "k", nil))
	if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("got %v, want store.ErrNotMigrated telling to run Migrate", err)
	}
}

// The message id has one name and one type on both sides: the same join of the outbox on the inbox
// and the dead letters runs on every database, canonical UUIDs and other ids alike.
func oneMessageID[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	ctx := context.Background()
	canonical := pipeline.NewEvent("E", "k", nil)
	other := message.NewMessage("order-42/placed", nil)
	if err := publishIn(e, nil, "orders", canonical, other); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{canonical.UUID, other.UUID} {
		itx, err := e.Store.Session().BeginInbox(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := itx.InsertInbox(ctx, "billing", id, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := itx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox_messages o JOIN {{schema}}.inbox i ON i.message_id = o.message_id
		WHERE i.consumer = ?`, "billing")
	if n != 2 {
		t.Fatalf("the join of outbox_messages on the inbox by message_id found %d of 2 messages", n)
	}
}
