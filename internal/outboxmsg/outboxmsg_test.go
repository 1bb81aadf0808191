package outboxmsg

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// A UUID repeated within one call is refused naming both messages, in short calls (compared in
// place) and long ones (a map) alike.
func TestRowsRefusesAUUIDRepeatedWithinTheCall(t *testing.T) {
	for _, n := range []int{2, 16, 17, 100} {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("id-%d", i), nil)
		}
		if _, err := Rows("orders", msgs); err != nil {
			t.Fatalf("%d distinct messages: %v", n, err)
		}
		msgs[n-1] = message.NewMessage("id-0", nil)
		_, err := Rows("orders", msgs)
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Index != n-1 || !errors.Is(err, store.ErrDuplicateUUID) {
			t.Fatalf("%d messages, the last repeating the first: %v", n, err)
		}
	}
}

// The row's metadata is what encoding/json writes for the map, byte for byte: every ASCII
// character (the controls, the quote, the backslash, the HTML ones), U+2028 and U+2029, other
// multi-byte characters, keys out of order, empty values.
func TestMetadataJSONIsEncodingJSON(t *testing.T) {
	var ascii strings.Builder
	for b := 1; b < utf8.RuneSelf; b++ {
		ascii.WriteByte(byte(b))
	}
	for _, md := range []message.Metadata{
		{},
		{"outboxkit_event_type": "OrderPlaced"},
		{"z": "", "a": "1", "m": "é", "B": "\u2028\u2029", "": "empty key"},
		{"ascii": ascii.String(), ascii.String(): "as a key"},
		{"mixed": "a\u2028b\u2029c\u2027\u202a€😀<tag>&amp;\"q\"\\"},
	} {
		want, err := json.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		if got := metadataJSON(md, false); string(got) != string(want) {
			t.Errorf("metadata %q encoded as\n%s\nwant\n%s", md, got, want)
		}
	}
	md := message.Metadata{outboxkit.MetadataPartitionKey: "o-1", "a": "1"}
	if got := string(metadataJSON(md, true)); got != `{"a":"1"}` {
		t.Errorf("metadata less its partition key encoded as %s, want {\"a\":\"1\"}", got)
	}
	if got := string(metadataJSON(message.Metadata{outboxkit.MetadataPartitionKey: "o-1"}, true)); got != "{}" {
		t.Errorf("metadata with only its partition key encoded as %s, want {}", got)
	}
}

// Building an event's row allocates the row and its metadata JSON, nothing else: at one client the
// writer's CPU is in the transaction's latency, and encoding/json's map encoder allocated eight
// times more (a copy of the map, the sorted keys, reflection's values).
func TestRowsOfAnEventAllocateTheRowAndItsJSON(t *testing.T) {
	msg := message.NewMessage("0192e5c4-7b1a-7000-8000-000000000001", []byte(`{"id":"o-1"}`))
	outboxkit.SetEventType(msg, "OrderPlaced")
	outboxkit.SetPartitionKey(msg, "o-1")
	msg.Metadata.Set("source", "checkout")
	msgs := []*message.Message{msg}
	if n := testing.AllocsPerRun(100, func() { _, _ = Rows("orders", msgs) }); n > 2 {
		t.Fatalf("Rows of one event allocates %v times; want 2, the rows and the metadata JSON", n)
	}
}

func FuzzMetadataJSON(f *testing.F) {
	f.Add("k", "v")
	f.Add("<a&b>", "\u2028\t\x7f\x1f")
	f.Fuzz(func(t *testing.T, k, v string) {
		if !utf8.ValidString(k) || !utf8.ValidString(v) || strings.IndexByte(k+v, 0) >= 0 {
			return // toRow refuses these
		}
		md := message.Metadata{k: v, k + "2": v + v}
		want, _ := json.Marshal(md)
		if got := metadataJSON(md, false); string(got) != string(want) {
			t.Fatalf("metadata %q encoded as %s, want %s", md, got, want)
		}
	})
}

func BenchmarkRows(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("0192e5c4-7b1a-7000-8000-%012d", i), []byte(`{"id":"o-1"}`))
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Rows("orders", msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// An event as pipeline.NewEvent makes it, with a header of the caller's: the metadata JSON is most
// of what building its row costs.
func BenchmarkRowsOfAnEvent(b *testing.B) {
	msg := message.NewMessage("0192e5c4-7b1a-7000-8000-000000000001", []byte(`{"id":"o-1"}`))
	outboxkit.SetEventType(msg, "OrderPlaced")
	outboxkit.SetPartitionKey(msg, "o-1")
	msg.Metadata.Set("source", "checkout")
	msgs := []*message.Message{msg}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Rows("orders", msgs); err != nil {
			b.Fatal(err)
		}
	}
}
