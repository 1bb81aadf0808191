// Command benchpair prints the paired ratios of two builds of internal/cmd/bench run alternately, round by
// round, as scripts/bench-compare.sh runs them. It reads DIR/<scenario>/round<N>-ref.json and
// DIR/<scenario>/round<N>-current.json (the files the bench writes with --json) and prints, per
// scenario and per figure both builds report, the ratio current/ref of each round's medians, with
// the median and range of those ratios over the rounds, and each run's own ratios to stock
// Watermill when the bench reports them.
//
//	go run ./internal/cmd/benchpair --scenarios drain,consumer --ref 2adf07f --current 1a2b3c4 DIR
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// series is one figure as the bench writes it: every repetition of one run.
type series struct {
	Name   string    `json:"name"`
	Unit   string    `json:"unit"`
	Values []float64 `json:"values"`
}

type run struct {
	Series []series `json:"series"`
}

// round holds one round's pair of runs; a side that failed or wrote nothing is nil.
type round struct {
	n            int
	ref, current map[string]series
}

func main() {
	scenarios := flag.String("scenarios", "", "the scenarios to print, comma-separated, in order (empty: every folder in DIR)")
	refLabel := flag.String("ref", "ref", "what the ref runs were built from")
	curLabel := flag.String("current", "current", "what the current runs were built from")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: benchpair [--scenarios a,b] [--ref LABEL] [--current LABEL] DIR")
		os.Exit(2)
	}
	if err := report(os.Stdout, flag.Arg(0), split(*scenarios), *refLabel, *curLabel); err != nil {
		fmt.Fprintln(os.Stderr, "benchpair:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func report(w io.Writer, dir string, scenarios []string, refLabel, curLabel string) error {
	if len(scenarios) == 0 {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.IsDir() {
				scenarios = append(scenarios, e.Name())
			}
		}
	}
	if len(scenarios) == 0 {
		return fmt.Errorf("%s holds no scenario folder: run scripts/bench-compare.sh", dir)
	}
	for _, sc := range scenarios {
		rounds, err := readRounds(filepath.Join(dir, sc))
		if err != nil {
			return fmt.Errorf("scenario %s: %w", sc, err)
		}
		printScenario(w, sc, rounds, refLabel, curLabel)
	}
	return nil
}

// readRounds reads the round<N>-ref.json and round<N>-current.json files of one scenario.
func readRounds(dir string) ([]round, error) {
	byN := map[int]*round{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "round") || !strings.HasSuffix(name, ".json") {
			continue
		}
		num, side, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(name, "round"), ".json"), "-")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || (side != "ref" && side != "current") {
			continue
		}
		figures, err := readRun(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		r := byN[n]
		if r == nil {
			r = &round{n: n}
			byN[n] = r
		}
		if side == "ref" {
			r.ref = figures
		} else {
			r.current = figures
		}
	}
	var out []round
	for _, r := range byN {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b round) int { return a.n - b.n })
	return out, nil
}

func readRun(path string) (map[string]series, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r run
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s is not a bench JSON file: %w", path, err)
	}
	m := make(map[string]series, len(r.Series))
	for _, s := range r.Series {
		m[s.Name] = s
	}
	return m, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// figure is one figure's pairing over the rounds.
type figure struct {
	name, unit           string
	ref, current         []float64 // each round's run median, where that run reported the figure
	ratios               []float64 // current/ref of the rounds where both did and ref was not 0
	onlyRef, onlyCurrent bool
}

// pair pairs every figure by round: the ratio of a round is the current run's median over the
// ref run's median of that same round, so that drift of the machine between rounds cancels.
func pair(rounds []round) []figure {
	var order []string
	seen := map[string]bool{}
	for _, r := range rounds {
		for _, side := range []map[string]series{r.current, r.ref} {
			var names []string
			for name := range side {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, n := range names {
				if !seen[n] {
					seen[n] = true
					order = append(order, n)
				}
			}
		}
	}
	var out []figure
	for _, name := range order {
		f := figure{name: name}
		inRef, inCur := false, false
		for _, r := range rounds {
			rs, okR := r.ref[name]
			cs, okC := r.current[name]
			okR = okR && len(rs.Values) > 0
			okC = okC && len(cs.Values) > 0
			if okR {
				inRef = true
				f.unit = rs.Unit
				f.ref = append(f.ref, median(rs.Values))
			}
			if okC {
				inCur = true
				f.unit = cs.Unit
				f.current = append(f.current, median(cs.Values))
			}
			if okR && okC && median(rs.Values) != 0 {
				f.ratios = append(f.ratios, median(cs.Values)/median(rs.Values))
			}
		}
		f.onlyRef, f.onlyCurrent = inRef && !inCur, inCur && !inRef
		out = append(out, f)
	}
	return out
}

// againstStock reports whether a figure is a run's own ratio to stock Watermill.
func againstStock(f figure) bool {
	return f.unit == "×" && strings.Contains(strings.ToLower(f.name), "stock")
}

func printScenario(w io.Writer, name string, rounds []round, refLabel, curLabel string) {
	complete := 0
	for _, r := range rounds {
		if r.ref != nil && r.current != nil {
			complete++
		}
	}
	fmt.Fprintf(w, "\n== %s: current (%s) / ref (%s), %d paired rounds of %d\n", name, curLabel, refLabel, complete, len(rounds))
	figures := pair(rounds)
	width := len("figure")
	for _, f := range figures {
		width = max(width, len(f.name))
	}
	fmt.Fprintf(w, "  %-*s  %14s  %14s  %8s  %17s  %s\n", width, "figure", "ref", "current", "cur/ref", "min – max", "rounds")
	var only []string
	for _, f := range figures {
		if len(f.ratios) == 0 {
			switch {
			case f.onlyRef:
				only = append(only, "only ref: "+f.name)
			case f.onlyCurrent:
				only = append(only, "only current: "+f.name)
			}
			continue
		}
		fmt.Fprintf(w, "  %-*s  %14s  %14s  %7.3f×  %17s  %d\n", width, f.name,
			human(median(f.ref), f.unit), human(median(f.current), f.unit), median(f.ratios),
			fmt.Sprintf("%.3f – %.3f", slices.Min(f.ratios), slices.Max(f.ratios)), len(f.ratios))
	}
	for _, o := range only {
		fmt.Fprintf(w, "  (%s)\n", o)
	}
	var stock []figure
	for _, f := range figures {
		if againstStock(f) {
			stock = append(stock, f)
		}
	}
	if len(stock) == 0 {
		return
	}
	fmt.Fprintf(w, "  each run's own ratio to stock Watermill, round by round (ref | current):\n")
	for _, f := range stock {
		fmt.Fprintf(w, "    %-*s  %s | %s\n", width, f.name, ratios(f.ref), ratios(f.current))
	}
}

func ratios(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f×", x)
	}
	return strings.Join(parts, " ")
}

func human(v float64, unit string) string {
	switch unit {
	case "msg/s", "tx/s":
		if v >= 10000 {
			return fmt.Sprintf("%.1fk %s", v/1000, unit)
		}
		return fmt.Sprintf("%.0f %s", v, unit)
	case "×":
		return fmt.Sprintf("%.2f×", v)
	case "ms":
		return fmt.Sprintf("%.2f ms", v)
	case "%":
		return fmt.Sprintf("%.1f%%", v)
	}
	return strings.TrimSpace(fmt.Sprintf("%.3g %s", v, unit))
}
