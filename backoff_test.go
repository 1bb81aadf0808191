package outboxkit_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit"
)

func TestBackoffDelay(t *testing.T) {
	b := outboxkit.Backoff{Initial: time.Second, Max: 10 * time.Second, Multiplier: 2}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := b.Delay(i + 1); got != w {
			t.Errorf("Delay(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := b.Delay(10000); got != 10*time.Second {
		t.Errorf("Delay(10000) = %s, want the cap", got)
	}
	b.Jitter = 0.2
	var seen []time.Duration
	for i := 0; i < 200; i++ {
		d := b.Delay(3)
		if d < 3200*time.Millisecond || d > 4800*time.Millisecond {
			t.Fatalf("jittered Delay(3) = %s, outside 4s ±20%%", d)
		}
		seen = append(seen, d)
	}
	slices.Sort(seen)
	if seen[0] == seen[len(seen)-1] {
		t.Fatal("jitter produced a constant delay")
	}
}

func TestBackoffValidateRefusesSilentZeros(t *testing.T) {
	for want, b := range map[string]outboxkit.Backoff{
		"Retry.Initial must be positive":    {Max: time.Second, Multiplier: 2},
		"Retry.Max":                         {Initial: time.Second, Multiplier: 2},
		"Retry.Multiplier must be at least": {Initial: time.Second, Max: time.Second},
		"Retry.Jitter must be in [0, 1)":    {Initial: time.Second, Max: time.Second, Multiplier: 1, Jitter: -0.1},
	} {
		if err := b.Validate("Retry"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: got %v, want %q", b, err, want)
		}
	}
	if err := (outboxkit.Backoff{Initial: time.Second, Max: time.Second, Multiplier: 1}).Validate("Retry"); err != nil {
		t.Errorf("a constant backoff is valid when asked for: %v", err)
	}
}
