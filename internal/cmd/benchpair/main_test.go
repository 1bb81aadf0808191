package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRun(t *testing.T, dir, scenario, name string, s ...series) {
	t.Helper()
	d := filepath.Join(dir, scenario)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(map[string]any{"series": s})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, name), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPairTakesEachRoundsMediansThenTheirRatio(t *testing.T) {
	dir := t.TempDir()
	ours := func(v ...float64) series { return series{Name: "outboxkit forwarder", Unit: "msg/s", Values: v} }
	vs := func(v ...float64) series { return series{Name: "outboxkit / stock tuned", Unit: "×", Values: v} }
	// Round 1: ref median 100, current median 150 → 1.5. Round 2: 200 → 220 → 1.1.
	// Round 3: 50 → 60 → 1.2. Median of the ratios 1.2, range 1.1 – 1.5.
	writeRun(t, dir, "drain", "round1-ref.json", ours(90, 100, 400), vs(2, 2.5, 3))
	writeRun(t, dir, "drain", "round1-current.json", ours(150, 10, 900), vs(3, 3, 3))
	writeRun(t, dir, "drain", "round2-ref.json", ours(200), vs(2))
	writeRun(t, dir, "drain", "round2-current.json", ours(220), vs(2.2), series{Name: "new figure", Unit: "ms", Values: []float64{1}})
	writeRun(t, dir, "drain", "round3-ref.json", ours(40, 60), vs(1))
	writeRun(t, dir, "drain", "round3-current.json", ours(60), vs(1.5))

	rounds, err := readRounds(filepath.Join(dir, "drain"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(rounds))
	}
	byName := map[string]figure{}
	for _, f := range pair(rounds) {
		byName[f.name] = f
	}
	f := byName["outboxkit forwarder"]
	want := []float64{1.5, 1.1, 1.2}
	if len(f.ratios) != len(want) {
		t.Fatalf("ratios %v, want %v", f.ratios, want)
	}
	for i := range want {
		if d := f.ratios[i] - want[i]; d > 1e-9 || d < -1e-9 {
			t.Fatalf("ratios %v, want %v (round %d)", f.ratios, want, i+1)
		}
	}
	if got := median(f.ratios); got != 1.2 {
		t.Fatalf("median ratio %v, want 1.2", got)
	}
	if !byName["new figure"].onlyCurrent || len(byName["new figure"].ratios) != 0 {
		t.Fatalf("a figure only the current build reports must not be paired: %+v", byName["new figure"])
	}
	if !againstStock(byName["outboxkit / stock tuned"]) || againstStock(f) {
		t.Fatal("only the × figures naming stock are ratios to stock Watermill")
	}

	var out strings.Builder
	if err := report(&out, dir, []string{"drain"}, "2adf07f", "HEAD"); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"== drain: current (HEAD) / ref (2adf07f), 3 paired rounds of 3",
		"1.200×",
		"1.100 – 1.500",
		"(only current: new figure)",
		"2.50× 2.00× 1.00× | 3.00× 2.20× 1.50×",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the report lacks %q:\n%s", line, out.String())
		}
	}
}

func TestPairSkipsARoundOneSideOfWhichFailed(t *testing.T) {
	dir := t.TempDir()
	s := func(v float64) series { return series{Name: "x", Unit: "msg/s", Values: []float64{v}} }
	writeRun(t, dir, "consumer", "round1-ref.json", s(100))
	writeRun(t, dir, "consumer", "round1-current.json", s(300))
	writeRun(t, dir, "consumer", "round2-ref.json", s(100)) // the current run of round 2 failed
	rounds, err := readRounds(filepath.Join(dir, "consumer"))
	if err != nil {
		t.Fatal(err)
	}
	f := pair(rounds)[0]
	if len(f.ratios) != 1 || f.ratios[0] != 3 {
		t.Fatalf("ratios %v, want [3]: an unpaired round must not count", f.ratios)
	}
	var out strings.Builder
	if err := report(&out, dir, nil, "r", "c"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "1 paired rounds of 2") {
		t.Fatalf("the report must say a round is unpaired:\n%s", out.String())
	}
}

func TestReportRejectsABrokenRun(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "drain"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "drain", "round1-ref.json"), []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := report(&strings.Builder{}, dir, nil, "r", "c")
	if err == nil || !strings.Contains(err.Error(), "not a bench JSON file") {
		t.Fatalf("err = %v, want one naming the broken file", err)
	}
}
