package brokerio

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit"
)

func TestUndecodable(t *testing.T) {
	msg := Undecodable("Redis stream entry 1-0 of orders", errors.New("bad metadata"), []byte("\x00raw"),
		map[string]string{"uuid": "u-1", "metadata": "\xc1\x00", "note": "kept"}, "uuid")
	if msg.UUID != "" || string(msg.Payload) != "\x00raw" {
		t.Fatalf("read as %q %q; want no UUID and the payload as it came", msg.UUID, msg.Payload)
	}
	why := msg.Metadata.Get(outboxkit.MetadataUndecodable)
	if !strings.Contains(why, "entry 1-0 of orders") || !strings.Contains(why, "bad metadata") || !strings.Contains(why, `uuid "u-1"`) {
		t.Errorf("reason %q: want where, the error and the id field's value", why)
	}
	if _, ok := msg.Metadata["uuid"]; ok {
		t.Error("the id field is in the metadata, where a replay's publisher refuses it")
	}
	// Stored as JSON text: valid UTF-8, no NUL.
	if msg.Metadata["note"] != "kept" || msg.Metadata["metadata"] != "\uFFFD" {
		t.Errorf("metadata %q: want the other fields, storable", msg.Metadata)
	}
}
