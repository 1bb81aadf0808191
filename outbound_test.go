package outboxkit_test

import (
	"regexp"
	"testing"

	"github.com/outboxkit/outboxkit"
)

// The key is the documented uuid5, so any language derives the same one (these were computed
// with Python's uuid.uuid5), the same for every delivery, and different per consumer.
func TestOutboundKeyIsTheDocumentedUUID5(t *testing.T) {
	const msg = "0191e3a0-7c1d-7b2e-9f00-000000000001"
	for consumer, want := range map[string]string{
		"billing":  "f122788e-b9d5-52f0-8b43-fedb984eef5c",
		"shipping": "c74124dd-f609-5864-9b88-cf51a58aae9e",
	} {
		if got := outboxkit.OutboundKey(consumer, msg); got != want {
			t.Errorf("OutboundKey(%q, %q) = %s, want %s", consumer, msg, got, want)
		}
	}
	// The separator keeps ("ab", "c…") and ("a", "bc…") apart.
	if outboxkit.OutboundKey("ab", "c") == outboxkit.OutboundKey("a", "bc") {
		t.Error("consumer and message id run together")
	}
	headerSafe := regexp.MustCompile(`^[0-9a-f-]{36}$`)
	if k := outboxkit.OutboundKey("billing", "order-42/placed ünïcode"); !headerSafe.MatchString(k) {
		t.Errorf("key %q is not header-safe", k)
	}
}
