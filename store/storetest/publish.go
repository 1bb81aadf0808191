package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
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
	}
}

func migrateTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"Idempotent", migrateIdempotent[TTx]},
		{"RefusesNewerDatabase", migrateRefusesNewer[TTx]},
		{"SeveralProcessesAtOnce", migrateFromProcesses[TTx]},
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

func migrateIdempotent[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	ctx := context.Background()
	first, err := pipeline.Migrate(ctx, e.Store)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Applied) == 0 || first.Version != first.Applied[len(first.Applied)-1] {
		t.Fatalf("first run = %+v, want every migration applied", first)
	}
	second, err := pipeline.Migrate(ctx, e.Store)
	if err != nil || len(second.Applied) != 0 || second.Version != first.Version {
		t.Fatalf("second run = %+v, %v; want nothing applied", second, err)
	}
}

func migrateRefusesNewer[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	e.MustExec(t, `INSERT INTO {{schema}}.schema_migrations (version, name, applied_at) VALUES (9999, 'future', ?)`, "2030-01-01 00:00:00")
	if _, err := pipeline.Migrate(context.Background(), e.Store); !errors.Is(err, store.ErrNewerSchema) {
		t.Fatalf("got %v, want store.ErrNewerSchema", err)
	}
}

// Several processes migrate one database at once: each migration is applied exactly once.
func migrateFromProcesses[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	if h.ProcessURL == nil {
		t.Skipf("%s: no URL reaches the store from another process", h.Name)
	}
	for round := 0; round < 2; round++ {
		e := h.Open(t)
		url, ns := h.ProcessURL(t, e)
		var wg sync.WaitGroup
		outs := make([]string, 3)
		errs := make([]error, 3)
		for i := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
				cmd.Env = append(os.Environ(), helperEnv+"=migrate|"+url+"|"+ns)
				out, err := cmd.CombinedOutput()
				outs[i], errs[i] = string(out), err
			}()
		}
		wg.Wait()
		applied := 0
		for i, err := range errs {
			if err != nil {
				t.Fatalf("process %d: %v\n%s", i, err, outs[i])
			}
			applied += strings.Count(outs[i], "APPLIED ")
		}
		res, err := pipeline.Migrate(context.Background(), e.Store)
		if err != nil || len(res.Applied) != 0 {
			t.Fatalf("after the processes: %+v, %v", res, err)
		}
		if migrations := e.MustInt(t, `SELECT count(*) FROM {{schema}}.schema_migrations`); applied != migrations {
			t.Fatalf("round %d: the processes applied %d migrations in all, the database has %d: each must be applied exactly once",
				round, applied, migrations)
		}
	}
}

func runHelper(t *testing.T, spec string) {
	parts := strings.Split(spec, "|")
	if parts[0] != "migrate" || len(parts) != 3 {
		t.Fatalf("helper: unknown task %q", spec)
	}
	ctx := context.Background()
	db, err := store.Open(ctx, parts[1], store.OpenOptions{Schema: parts[2], PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := pipeline.Migrate(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Applied {
		os.Stdout.WriteString("APPLIED " + string(rune('0'+v%10)) + "\n")
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
