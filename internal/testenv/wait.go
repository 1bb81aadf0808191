package testenv

import (
	"testing"
	"time"
)

// Eventually polls cond every few milliseconds until it holds, failing the test if within passes
// first. what names the condition in the failure message.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(within, cond) {
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// Within polls cond as Eventually does and reports whether it held before within passed: for a
// test whose failure message says what it found at the deadline.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}
