package walmsg

import (
	"bytes"
	"testing"
)

func TestRoundTripAndRefusals(t *testing.T) {
	e := Envelope{UUID: "0193a1f0-0000-7000-8000-000000000001", Topic: "orders", PartitionKey: "o-1", Metadata: []byte(`{"a":"b"}`), Payload: []byte("payload")}
	b := Encode(e)
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.UUID != e.UUID || got.Topic != e.Topic || got.PartitionKey != e.PartitionKey || !bytes.Equal(got.Metadata, e.Metadata) || !bytes.Equal(got.Payload, e.Payload) {
		t.Fatalf("got %+v, want %+v", got, e)
	}
	for _, bad := range [][]byte{nil, {0}, {2, 1, 'x'}, b[:5], {1, 0, 0, 0, 0}} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
}
