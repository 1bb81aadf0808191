package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMedianAndSpread(t *testing.T) {
	s := series{Values: []float64{5, 1, 3}}
	if got := s.median(); got != 3 {
		t.Fatalf("median of 5,1,3 = %v, want 3", got)
	}
	s.add(7)
	if got := s.median(); got != 4 {
		t.Fatalf("median of 5,1,3,7 = %v, want 4", got)
	}
	if lo, hi := s.spread(); lo != 1 || hi != 7 {
		t.Fatalf("spread = %v–%v, want 1–7", lo, hi)
	}
	if s.Values[0] != 5 {
		t.Fatal("median must not reorder the recorded rounds: ratios pair them by index")
	}
}

func TestRatioAndOverheadPairByRound(t *testing.T) {
	a := series{Values: []float64{10, 30, 8}}
	b := series{Values: []float64{5, 10, 0}} // a zero is skipped, not divided by
	r := ratio("a/b", a, b)
	if len(r.Values) != 2 || r.Values[0] != 2 || r.Values[1] != 3 {
		t.Fatalf("ratio = %v, want [2 3]", r.Values)
	}
	o := overhead("cost", series{Values: []float64{1.2, 3}}, series{Values: []float64{1, 2}})
	if len(o.Values) != 2 || o.Values[0] < 19.99 || o.Values[0] > 20.01 || o.Values[1] != 50 {
		t.Fatalf("overhead = %v, want [20 50]", o.Values)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond} {
		if got := percentile(s, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if percentile(nil, 99) != 0 {
		t.Error("percentile of nothing should be 0")
	}
}

func TestCompareWith(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.json")
	old, _ := json.Marshal(map[string]any{"when": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "series": []series{
		{Name: "drain", Unit: "msg/s", Values: []float64{1000, 2000, 3000}},
	}})
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := compareWith(path, []series{
		{Name: "drain", Unit: "msg/s", Values: []float64{3000}},
		{Name: "new figure", Unit: "ms", Values: []float64{1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2000 → 3000", "+50.0%", "not in " + path + ": new figure"} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
	if err := os.WriteFile(path, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := compareWith(path, nil); err == nil || !strings.Contains(err.Error(), "not a bench JSON file") {
		t.Fatalf("a broken file gave %v, want a clear error", err)
	}
}
