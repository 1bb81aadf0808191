package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// The write path's ratios pair modes by round, so within a round every mode must be measured at
// each client count before the next round starts, and each figure land in its own mode's series.
func TestMeasureWritesAlternatesModesWithinARound(t *testing.T) {
	modes := []writeMode{{key: "alone", name: "alone"}, {key: "outbox", name: "outbox", outbox: true}}
	var calls []string
	target := &writeTarget{load: func(_ context.Context, m writeMode, n int, d time.Duration) ([]time.Duration, time.Duration, error) {
		calls = append(calls, fmt.Sprintf("%s/%d", m.key, n))
		per := time.Millisecond
		if m.outbox {
			per = 2 * time.Millisecond
		}
		lat := make([]time.Duration, 100*n)
		for i := range lat {
			lat[i] = per
		}
		return lat, 100 * per, nil // n clients, 100 transactions each
	}}
	fig, err := measureWrites(context.Background(), config{reps: 2, writeFor: time.Second}, target, modes, []int{1, 4}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	round := []string{"alone/1", "outbox/1", "alone/4", "outbox/4"}
	if want := slices.Concat(round, round); !slices.Equal(calls, want) {
		t.Fatalf("measured in the order %v, want %v", calls, want)
	}
	for mi, m := range modes {
		for _, n := range []int{1, 4} {
			tps := fig.tps[writeKey{mi, n}]
			want := float64(100*n) / (100 * (time.Millisecond * time.Duration(1+mi))).Seconds()
			if len(tps.Values) != 2 || tps.Values[0] != want || tps.Values[1] != want {
				t.Errorf("%s at %d clients: tx/s %v, want %v in each of 2 rounds", m.key, n, tps.Values, want)
			}
			if p50 := fig.p50[writeKey{mi, n}].median(); p50 != float64(1+mi) {
				t.Errorf("%s at %d clients: p50 %v ms, want %d", m.key, n, p50, 1+mi)
			}
		}
	}
}
