package idempotency_test

// The middleware against real databases is tested by the store conformance suite
// (store/storetest), once per store driver.

import (
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/idempotency"
)

func TestConfigSaysWhatIsWrong(t *testing.T) {
	_, err := idempotency.Middleware(idempotency.Config{MaxBodyBytes: -1})
	for _, want := range []string{"field Store is required", "MaxBodyBytes must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %q", err, want)
		}
	}
}
