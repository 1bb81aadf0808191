package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// series holds the repetitions of one measured figure.
type series struct {
	Name   string    `json:"name"`
	Unit   string    `json:"unit"`
	Values []float64 `json:"values"`
}

func (s *series) add(v float64) { s.Values = append(s.Values, v) }

func (s series) median() float64 {
	if len(s.Values) == 0 {
		return 0
	}
	v := slices.Clone(s.Values)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func (s series) spread() (lo, hi float64) {
	if len(s.Values) == 0 {
		return 0, 0
	}
	return slices.Min(s.Values), slices.Max(s.Values)
}

// ratio pairs two series repetition by repetition (measured in the same round) and returns the
// per-round ratios a/b.
func ratio(name string, a, b series) series {
	r := series{Name: name, Unit: "×"}
	for i := range min(len(a.Values), len(b.Values)) {
		if b.Values[i] > 0 {
			r.add(a.Values[i] / b.Values[i])
		}
	}
	return r
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func human(v float64, unit string) string {
	switch unit {
	case "msg/s", "tx/s":
		if v >= 10000 {
			return fmt.Sprintf("%.1fk", v/1000)
		}
		return fmt.Sprintf("%.0f", v)
	case "×":
		return fmt.Sprintf("%.2f×", v)
	case "ms":
		return fmt.Sprintf("%.2f ms", v)
	case "%":
		return fmt.Sprintf("%.1f%%", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// table renders rows of series as "name | median | min–max | n".
func table(title string, rows []series) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n", title)
	width := 10
	for _, r := range rows {
		width = max(width, len(r.Name))
	}
	fmt.Fprintf(&b, "  %-*s  %12s  %22s  %s\n", width, "", "median", "min – max", "reps")
	for _, r := range rows {
		lo, hi := r.spread()
		fmt.Fprintf(&b, "  %-*s  %12s  %22s  %d\n", width, r.Name, human(r.median(), r.Unit)+" "+unitSuffix(r.Unit),
			human(lo, r.Unit)+" – "+human(hi, r.Unit), len(r.Values))
	}
	return b.String()
}

func unitSuffix(unit string) string {
	if unit == "×" || unit == "%" || unit == "ms" {
		return ""
	}
	return unit
}

// percentile returns the p-th percentile (nearest rank) of samples; 0 when there are none.
func percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// overhead pairs two series by round and returns how much larger a is than base, in percent.
func overhead(name string, a, base series) series {
	r := series{Name: name, Unit: "%"}
	for i := range min(len(a.Values), len(base.Values)) {
		if base.Values[i] > 0 {
			r.add(100 * (a.Values[i]/base.Values[i] - 1))
		}
	}
	return r
}

// compareWith prints every figure of this run beside the figure of the same name in an earlier
// run's JSON, with the change of the medians. Figures only one of the runs has are listed apart.
func compareWith(path string, now []series) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--compare: %w", err)
	}
	var before struct {
		When   time.Time `json:"when"`
		Series []series  `json:"series"`
	}
	if err := json.Unmarshal(raw, &before); err != nil {
		return "", fmt.Errorf("--compare: %s is not a bench JSON file: %w", path, err)
	}
	old := map[string]series{}
	for _, s := range before.Series {
		old[s.Name] = s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ncompared with %s (run %s): medians\n", path, before.When.Format(time.RFC3339))
	width := 0
	for _, s := range now {
		width = max(width, len(s.Name))
	}
	var missing []string
	for _, s := range now {
		o, ok := old[s.Name]
		if !ok || len(o.Values) == 0 {
			missing = append(missing, s.Name)
			continue
		}
		change := "       –"
		if o.median() != 0 {
			change = fmt.Sprintf("%+7.1f%%", 100*(s.median()/o.median()-1))
		}
		fmt.Fprintf(&b, "  %-*s  %14s → %-14s %s\n", width, s.Name, human(o.median(), o.Unit), human(s.median(), s.Unit), change)
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, "  not in %s: %s\n", path, strings.Join(missing, "; "))
	}
	return b.String(), nil
}
