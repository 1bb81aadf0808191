package middleware_test

// The inbox, the delivery count, dead-lettering, replay and the order guard against real
// databases are tested by the store conformance suite (store/storetest), once per store driver.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/middleware"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errTransient = errors.New("downstream service unavailable")

func TestStackConfigSaysWhatIsMissing(t *testing.T) {
	_, err := middleware.Stack(middleware.StackConfig{Consumer: "Shipping Service!"})
	for _, want := range []string{"field Store is required", `field Consumer "Shipping Service!"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %q", err, want)
		}
	}
}

// waitFor polls cond until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
