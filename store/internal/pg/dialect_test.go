package pg

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/store"
)

// The writers' INSERT: six placeholders a message, numbered as its arguments go, the notify
// channel last; the one-message text the dialect keeps is InsertQuery's.
func TestOutboxInsert(t *testing.T) {
	msgs := []store.OutboxMessage{
		{UUID: "0192e5c4-7b1a-7000-8000-000000000001", Topic: "orders", PartitionKey: "o-1", Payload: []byte("x"), Metadata: []byte("{}")},
		{UUID: "order-2", Topic: "orders", Metadata: []byte(`{"a":"b"}`)},
		{UUID: "0192e5c4-7b1a-7000-8000-000000000003", Topic: "t", Metadata: []byte("{}")},
	}
	query, args, err := InsertQuery("s", msgs[:2], true)
	if err != nil {
		t.Fatal(err)
	}
	want := `WITH inserted AS (
INSERT INTO "s".outbox (uuid, uuid_text, topic, partition_key, payload, metadata) VALUES ` +
		`($1::uuid, $2::text, $3::text, $4::text, $5::bytea, $6::text), ($7::uuid, $8::text, $9::text, $10::text, $11::bytea, $12::text)
)
SELECT pg_notify($13, '') WHERE NOT EXISTS (SELECT 1 FROM "s".relay_awake WHERE awake_until > clock_timestamp())`
	key2, _ := pgsql.StoredID("order-2")
	wantArgs := fmt.Sprint([]any{"0192e5c4-7b1a-7000-8000-000000000001", nil, "orders", "o-1", []byte("x"), "{}",
		key2, "order-2", "orders", nil, []byte{}, `{"a":"b"}`, "s_outbox"})
	if query != want || fmt.Sprint(args) != wantArgs {
		t.Fatalf("two messages, notify:\n%s\n%v\nwant\n%s\n%v", query, args, want, wantArgs)
	}
	for _, notify := range []bool{true, false} {
		d, err := New(Config{Schema: "s", DisableNotify: !notify})
		if err != nil {
			t.Fatal(err)
		}
		for n := 1; n <= len(msgs); n++ {
			query, args, err := d.OutboxInsert(msgs[:n])
			if err != nil {
				t.Fatal(err)
			}
			want, wantArgs, err := InsertQuery("s", msgs[:n], notify)
			if err != nil {
				t.Fatal(err)
			}
			if query != want || fmt.Sprint(args) != fmt.Sprint(wantArgs) {
				t.Fatalf("notify %v, %d messages: the dialect sends\n%s %v\nwhere InsertQuery builds\n%s %v", notify, n, query, args, want, wantArgs)
			}
			if !strings.Contains(query, fmt.Sprintf("$%d", len(args))) || strings.Contains(query, fmt.Sprintf("$%d", len(args)+1)) ||
				strings.Contains(query, "pg_notify") != notify {
				t.Fatalf("notify %v, %d messages: %d arguments for\n%s", notify, n, len(args), query)
			}
		}
	}
}

// Publish's statement of one message is the dialect's, not built again per call: formatting it
// was most of what building the statement cost, inside the caller's transaction.
func TestOutboxInsertOfOneMessageIsBuiltOnce(t *testing.T) {
	for _, notify := range []bool{true, false} {
		d, err := New(Config{DisableNotify: !notify})
		if err != nil {
			t.Fatal(err)
		}
		var texts []*byte
		for _, id := range []string{"0192e5c4-7b1a-7000-8000-000000000001", "order-2"} {
			query, _, err := d.OutboxInsert([]store.OutboxMessage{{UUID: id, Topic: "orders"}})
			if err != nil {
				t.Fatal(err)
			}
			texts = append(texts, unsafe.StringData(query))
		}
		if texts[0] != texts[1] {
			t.Fatalf("notify %v: each call built the one-message INSERT's text again", notify)
		}
	}
}

// The writers' statement for one event, as Publish builds it: its text and its arguments.
func BenchmarkOutboxInsert(b *testing.B) {
	msgs := []store.OutboxMessage{{UUID: "0192e5c4-7b1a-7000-8000-000000000001", Topic: "orders", PartitionKey: "o-1",
		Payload: []byte(`{"id":"o-1"}`), Metadata: []byte(`{"outboxkit_event_type":"OrderPlaced"}`)}}
	for _, notify := range []bool{true, false} {
		d, err := New(Config{DisableNotify: !notify})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("notify=%v", notify), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := d.OutboxInsert(msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
