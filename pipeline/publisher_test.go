package pipeline_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// drivers are the three ways a team may hold a transaction.
var drivers = []struct {
	name    string
	publish func(t *testing.T, pg *testenv.PG, body func(exec func(string, ...any) error, pub message.Publisher) error) error
}{
	{"lib/pq", func(t *testing.T, pg *testenv.PG, body func(func(string, ...any) error, message.Publisher) error) error {
		return stdTx(t, "postgres", pg, body)
	}},
	{"pgx-stdlib", func(t *testing.T, pg *testenv.PG, body func(func(string, ...any) error, message.Publisher) error) error {
		return stdTx(t, "pgx", pg, body)
	}},
	{"pgx-native", func(t *testing.T, pg *testenv.PG, body func(func(string, ...any) error, message.Publisher) error) error {
		ctx := context.Background()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
		if err != nil {
			t.Fatal(err)
		}
		exec := func(q string, args ...any) error { _, err := tx.Exec(ctx, pg.Schema.Render(q), args...); return err }
		if err := body(exec, pub); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}},
}

func stdTx(t *testing.T, driver string, pg *testenv.PG, body func(func(string, ...any) error, message.Publisher) error) error {
	db, err := sql.Open(driver, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	pub, err := pipeline.NewPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) error { _, err := tx.Exec(pg.Schema.Render(q), args...); return err }
	if err := body(exec, pub); err != nil {
		return err
	}
	return tx.Commit()
}

func TestPublish_BusinessRowAndOutboxRowCommitTogether(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			// The deferred key makes the duplicate order fail at COMMIT, after both inserts ran.
			pg.Exec(t, `CREATE TABLE {{schema}}.orders (id text PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, total int)`)

			placeOrder := func(id string) error {
				return d.publish(t, pg, func(exec func(string, ...any) error, pub message.Publisher) error {
					if err := exec(`INSERT INTO {{schema}}.orders (id, total) VALUES ($1, 10)`, id); err != nil {
						return err
					}
					return pub.Publish("orders", pipeline.NewEvent("OrderPlaced", id, []byte(`{"id":"`+id+`"}`)))
				})
			}
			if err := placeOrder("o-1"); err != nil {
				t.Fatalf("first order: %v", err)
			}
			err := placeOrder("o-1")
			if err == nil {
				t.Fatal("second order with the same id committed; want a duplicate-key error at commit")
			}
			if !strings.Contains(err.Error(), "duplicate key") {
				t.Fatalf("second order: got %v, want a duplicate key error", err)
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
				t.Fatalf("outbox rows = %d, want 1 (the failed order's event must not survive)", n)
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`); n != 1 {
				t.Fatalf("orders = %d, want 1", n)
			}
		})
	}
}

func TestPublish_StoresWhatTheForwarderNeeds(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			a := pipeline.NewEvent("OrderPlaced", "order-7", []byte{0, 1, 2, 255}) // binary payloads survive
			b := pipeline.NewEvent("OrderPaid", "order-7", nil)
			c := message.NewMessage("plain-uuid", []byte("x")) // no key, no type
			c.Metadata.Set("traceparent", "00-abc-def-01")
			err := d.publish(t, pg, func(_ func(string, ...any) error, pub message.Publisher) error {
				return pub.Publish("orders", a, b, c)
			})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := pg.Pool.Query(context.Background(), pg.Schema.Render(
				`SELECT uuid, topic, coalesce(partition_key, '<null>'), payload, metadata->>'outboxkit_event_type',
				        metadata->>'traceparent', attempts, published_at IS NULL
				 FROM {{schema}}.outbox ORDER BY seq`))
			if err != nil {
				t.Fatal(err)
			}
			type row struct {
				uuid, topic, key string
				payload          []byte
				typ, trace       *string
				attempts         int
				pending          bool
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				err := r.Scan(&x.uuid, &x.topic, &x.key, &x.payload, &x.typ, &x.trace, &x.attempts, &x.pending)
				return x, err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 {
				t.Fatalf("got %d rows, want 3", len(got))
			}
			want := []struct{ uuid, key string }{{a.UUID, "order-7"}, {b.UUID, "order-7"}, {"plain-uuid", "<null>"}}
			for i, w := range want {
				if got[i].uuid != w.uuid || got[i].key != w.key || got[i].topic != "orders" || !got[i].pending || got[i].attempts != 0 {
					t.Errorf("row %d = %+v, want uuid %s key %s topic orders, pending, 0 attempts", i, got[i], w.uuid, w.key)
				}
			}
			if string(got[0].payload) != string([]byte{0, 1, 2, 255}) || len(got[1].payload) != 0 {
				t.Errorf("payloads = %v, %v", got[0].payload, got[1].payload)
			}
			if got[0].typ == nil || *got[0].typ != "OrderPlaced" || got[2].trace == nil || *got[2].trace != "00-abc-def-01" {
				t.Errorf("metadata not stored: type %v trace %v", got[0].typ, got[2].trace)
			}
		})
	}
}

func TestPublish_BadInputWritesNothing(t *testing.T) {
	t.Parallel()
	nul := pipeline.NewEvent("E", "k", nil)
	nul.Metadata.Set("note", "a\x00b")
	badUTF8 := pipeline.NewEvent("E", "k", nil)
	badUTF8.Metadata.Set("note", "\xff\xfe")
	cases := []struct {
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
	}
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			for _, c := range cases {
				err := d.publish(t, pg, func(_ func(string, ...any) error, pub message.Publisher) error {
					return pub.Publish(c.topic, c.msgs...)
				})
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
				}
			}
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
				t.Fatalf("outbox rows = %d after rejected publishes, want 0", n)
			}
		})
	}
}

func TestPublish_DuplicateUUID(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msg := pipeline.NewEvent("E", "k", nil)
	publish := func() error {
		return drivers[0].publish(t, pg, func(_ func(string, ...any) error, pub message.Publisher) error {
			return pub.Publish("orders", msg)
		})
	}
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	if err := publish(); !errors.Is(err, pipeline.ErrDuplicateUUID) {
		t.Fatalf("got %v, want ErrDuplicateUUID", err)
	}
}

func TestPublish_FinishedTransaction(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	ctx := context.Background()

	for _, driver := range []string{"postgres", "pgx"} {
		db, err := sql.Open(driver, pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, finish := range []string{"rollback", "commit"} {
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			pub, err := pipeline.NewPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
			if err != nil {
				t.Fatal(err)
			}
			if finish == "rollback" {
				_ = tx.Rollback()
			} else {
				_ = tx.Commit()
			}
			err = pub.Publish("orders", pipeline.NewEvent("E", "k", nil))
			if !errors.Is(err, pipeline.ErrTxClosed) {
				t.Errorf("%s after %s: got %v, want ErrTxClosed", driver, finish, err)
			}
		}
	}

	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil)); !errors.Is(err, pipeline.ErrTxClosed) {
		t.Errorf("pgx after rollback: got %v, want ErrTxClosed", err)
	}

	// A transaction aborted by an earlier failed statement.
	tx, err = pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, _ = tx.Exec(ctx, "SELECT 1/0")
	pub, _ = pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
	if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil)); !errors.Is(err, pipeline.ErrTxAborted) {
		t.Errorf("aborted tx: got %v, want ErrTxAborted", err)
	}

	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
		t.Fatalf("outbox rows = %d, want 0", n)
	}
}

func TestPublish_WithoutMigrationSaysWhatToDo(t *testing.T) {
	t.Parallel()
	pg := testenv.NewEmptyPG(t)
	err := drivers[2].publish(t, pg, func(_ func(string, ...any) error, pub message.Publisher) error {
		return pub.Publish("orders", pipeline.NewEvent("E", "k", nil))
	})
	if err == nil || !strings.Contains(err.Error(), "pipeline.Migrate") {
		t.Fatalf("got %v, want an error telling to run pipeline.Migrate", err)
	}
}

func TestPublish_NotifiesOnCommitOnly(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN "`+pg.Schema.NotifyChannel()+`"`); err != nil {
		t.Fatal(err)
	}
	waitNotification := func(d time.Duration) bool {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := listener.WaitForNotification(ctx)
		return err == nil
	}

	publishIn := func(commit bool) {
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: string(pg.Schema)})
		if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil), pipeline.NewEvent("E", "k", nil)); err != nil {
			t.Fatal(err)
		}
		if waitNotification(200 * time.Millisecond) {
			t.Fatal("notification arrived before commit")
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	publishIn(false)
	if waitNotification(500 * time.Millisecond) {
		t.Fatal("a rolled-back publish woke the relay")
	}
	publishIn(true)
	if !waitNotification(10 * time.Second) {
		t.Fatal("no notification after commit")
	}
}

func TestPublish_DisableNotify(t *testing.T) {
	t.Parallel()
	q, err := pipeline.SchemaAdapter{DisableNotify: true}.InsertQuery(insertParams("orders", pipeline.NewEvent("E", "k", nil)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(q.Query, "pg_notify") {
		t.Fatalf("query notifies with DisableNotify: %s", q.Query)
	}
	q, _ = pipeline.SchemaAdapter{}.InsertQuery(insertParams("orders", pipeline.NewEvent("E", "k", nil)))
	if !strings.Contains(q.Query, "pg_notify") || q.Args[len(q.Args)-1] != "outboxkit_outbox" {
		t.Fatalf("default query does not notify channel outboxkit_outbox: %s %v", q.Query, q.Args)
	}
}

func TestPartitionKeyHelpers(t *testing.T) {
	msg := pipeline.NewEvent("OrderPlaced", "order-1", nil)
	if outboxkit.PartitionKey(msg) != "order-1" || outboxkit.EventType(msg) != "OrderPlaced" {
		t.Fatalf("metadata = %v", msg.Metadata)
	}
	if len(msg.UUID) != 36 || msg.UUID[14] != '7' {
		t.Fatalf("UUID %q is not a version 7 UUID", msg.UUID)
	}
	if pipeline.NewEvent("E", "", nil).Metadata.Get(outboxkit.MetadataPartitionKey) != "" {
		t.Fatal("empty key stored")
	}
}
