package console

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestNiceScaleHasThreeOrFourTicksAndUsesTheHeight(t *testing.T) {
	for _, c := range []struct {
		peak      float64
		whole     bool
		top, step float64
	}{
		{0, true, 3, 1}, {2, true, 3, 1}, {13, true, 15, 5}, {28, true, 30, 10}, {2900, true, 3000, 1000}, {7, true, 10, 5},
		{0, false, 1, 0.5}, {0.27, false, 0.3, 0.1}, {3.1, false, 4, 2}, {0.03, false, 0.03, 0.01}, {185, false, 200, 100},
	} {
		if top, step := niceScale(c.peak, c.whole); math.Abs(top-c.top) > 1e-9 || math.Abs(step-c.step) > 1e-9 {
			t.Errorf("niceScale(%g, %v) = %g, %g; want %g, %g", c.peak, c.whole, top, step, c.top, c.step)
		}
	}
	for _, whole := range []bool{true, false} {
		for peak := 0.0013; peak < 1e10; peak *= 1.07 {
			top, step := niceScale(peak, whole)
			ticks := int(math.Round(top/step)) + 1
			mant := step / math.Pow(10, math.Floor(math.Log10(step)+1e-9))
			switch {
			case top < peak:
				t.Fatalf("niceScale(%g): top %g is below the peak", peak, top)
			case ticks < 3 || ticks > 4:
				t.Fatalf("niceScale(%g, %v): %d ticks of %g to %g", peak, whole, ticks, step, top)
			case peak > 3 && peak <= top/3:
				t.Fatalf("niceScale(%g): top %g leaves the peak in the lowest third", peak, top)
			case whole && step != math.Trunc(step):
				t.Fatalf("niceScale(%g, whole): step %g", peak, step)
			case !nice(mant):
				t.Fatalf("niceScale(%g): step %g is not 1, 2, 2.5 or 5 times a power of ten", peak, step)
			}
		}
	}
}

func nice(m float64) bool {
	for _, n := range []float64{1, 2, 2.5, 5, 10} {
		if math.Abs(m-n) < 1e-6 {
			return true
		}
	}
	return false
}

func TestTickLabels(t *testing.T) {
	for _, c := range []struct {
		v, step, top float64
		want         string
	}{
		{0, 5000, 15000, "0"}, {5000, 5000, 15000, "5k"}, {7500, 2500, 7500, "7,500"}, {12500, 2500, 12500, "12.5k"},
		{0.25, 0.25, 0.75, "0.25"}, {0.5, 0.25, 0.75, "0.50"}, {2, 1, 3, "2"}, {2.5e6, 2.5e6, 1e7, "2.5M"}, {0.03, 0.01, 0.03, "0.03"},
	} {
		if got := tickLabel(c.v, c.step, c.top); got != c.want {
			t.Errorf("tickLabel(%g, %g, %g) = %q, want %q", c.v, c.step, c.top, got, c.want)
		}
	}
}

var chartNow = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func testChart(s ...series) chart {
	return chart{ID: "chart-test", Title: "Outbox pending", Sub: "rows, per topic", Unit: "rows", Whole: true, Now: chartNow, Span: time.Hour,
		Series: s, Empty: "No data yet: this console samples every 20 s."}
}

func pts(v ...float64) []point { // a point a minute, the last one now
	out := make([]point, len(v))
	for i, x := range v {
		out[i] = point{chartNow.Add(-time.Duration(len(v)-1-i) * time.Minute), x}
	}
	return out
}

var polyline = regexp.MustCompile(`<polyline class="line" points="([^"]*)"/>`)

// The x axis runs from an hour ago (x 48) to now (x 506), the y axis from 0 (y 154) to the top
// tick (y 20); a point older than the hour is left out.
func TestChartScalesToTheHour(t *testing.T) {
	s := series{Name: "shop.orders", Points: []point{{chartNow.Add(-2 * time.Hour), 5000}, {chartNow.Add(-time.Hour), 0},
		{chartNow.Add(-30 * time.Minute), 50}, {chartNow, 100}}}
	out := string(testChart(s).svg())
	m := polyline.FindAllStringSubmatch(out, -1)
	if len(m) != 1 || m[0][1] != "48.0,154.0 277.0,87.0 506.0,20.0" {
		t.Fatalf("the line: %q", m)
	}
	for _, want := range []string{`>0</text>`, `>50</text>`, `>100</text>`, `>rows</text>`, `>60</text>`, `>now</text>`, `>minutes ago</text>`,
		`<polygon class="area"`, `shop.orders now: <b>100</b> rows`} {
		if !strings.Contains(out, want) {
			t.Errorf("the chart has no %s", want)
		}
	}
	if strings.Contains(out, ">5,000<") || strings.Contains(out, "chart-legend") {
		t.Error("a point older than the hour set the scale, or one series has a legend")
	}
}

func TestChartOfNothingSaysWhy(t *testing.T) {
	for name, c := range map[string]chart{"no series": testChart(), "no point": testChart(series{Name: "a"}, series{Name: "b", Points: pts(math.NaN())})} {
		out := string(c.svg())
		if !strings.Contains(out, `<text class="empty"`) || !strings.Contains(out, ">No data yet: this console samples every 20 s.</tspan>") ||
			!strings.Contains(out, `<desc id="chart-test-desc">No data yet`) {
			t.Errorf("%s: the empty state says nothing: %s", name, out)
		}
		if strings.Contains(out, "<polyline") || strings.Contains(out, `class="unit"`) || strings.Contains(out, "<circle") {
			t.Errorf("%s: an empty chart draws a line, a dot or a y axis", name)
		}
		if !strings.Contains(out, `role="img" aria-label="Outbox pending over the last 60 minutes, in rows"`) {
			t.Errorf("%s: no accessible name", name)
		}
	}
}

func TestChartWrapsALongEmptyStateEvenly(t *testing.T) {
	c := testChart()
	c.Empty = "The broker's backlog is not read: no lag reader is configured (Config.Lag with Config.Consumers, or outboxctl console --broker URL --consumers …)."
	lines := regexp.MustCompile(`<tspan [^>]*>([^<]*)</tspan>`).FindAllStringSubmatch(string(c.svg()), -1)
	if len(lines) != 3 {
		t.Fatalf("%d lines: %q", len(lines), lines)
	}
	for _, l := range lines {
		if n := len(l[1]); n < 35 || n > 66 {
			t.Errorf("a line of %d bytes: %q", n, l[1])
		}
	}
}

// One point cannot make a line: it is a dot, on the scale of its figure.
func TestChartOfOnePointIsADot(t *testing.T) {
	out := string(testChart(series{Name: "billing", Points: pts(13)}).svg())
	if strings.Contains(out, "<polyline") || !strings.Contains(out, `<circle class="dot" cx="506.0"`) || !strings.Contains(out, ">15</text>") {
		t.Fatalf("one point: %s", out)
	}
}

func TestChartBreaksTheLineWhereAFigureIsMissing(t *testing.T) {
	out := string(testChart(series{Name: "billing", Points: pts(1, 2, math.NaN(), 3, 4)}).svg())
	if n := len(polyline.FindAllString(out, -1)); n != 2 {
		t.Fatalf("%d lines, want 2 either side of the gap", n)
	}
}

// Names are anyone's: a topic named <script> is text in the title, the description, the series'
// tooltip and the legend, and the figure stays well-formed.
func TestChartEscapesNames(t *testing.T) {
	evil := `<script>alert("x")</script>`
	c := testChart(series{Name: evil, Points: pts(1, 2)}, series{Name: `a&b'c`, Points: pts(3, 4)}, series{Name: "3 other topics", Other: true, Points: pts(1, 1)})
	c.Title, c.Unit = "<b>bold</b>", `"rows"`
	out := string(c.svg())
	if strings.Contains(out, "<script") || strings.Contains(out, "<b>bold") || strings.Contains(out, `&b'`) {
		t.Fatalf("a name is written as markup: %s", out)
	}
	for _, want := range []string{`data-name="&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"`, `<span class="name">&lt;script&gt;`, `<span class="name">a&amp;b&#39;c</span>`,
		`&lt;b&gt;bold&lt;/b&gt; over the last 60 minutes`, `>&#34;rows&#34;</text>`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in %s", want, out)
		}
	}
	d := xml.NewDecoder(strings.NewReader(out))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the figure is not well-formed: %v", err)
		}
	}
	// Three series: a legend, in order, the others grey.
	legend := regexp.MustCompile(`<li class="(\w+)">`).FindAllStringSubmatch(out, -1)
	if len(legend) != 3 || legend[0][1] != "s0" || legend[1][1] != "s1" || legend[2][1] != "so" {
		t.Fatalf("legend: %q", legend)
	}
}

// The time before the console's first sample is shaded and said to be unknown, in words that fit.
func TestChartShadesTheTimeBeforeItsFirstSample(t *testing.T) {
	for _, c := range []struct {
		before time.Duration
		say    string
	}{{5 * time.Minute, "no samples before this console started"}, {45 * time.Minute, "not sampled"}, {55 * time.Minute, ""}} {
		ch := testChart(series{Name: "a", Points: pts(1, 2)})
		ch.Since, ch.Unknown = chartNow.Add(-c.before), "no samples before this console started"
		out := string(ch.svg())
		if !strings.Contains(out, `<rect class="unknown" x="48" y="20" width="`) {
			t.Errorf("since %s ago: no shade", c.before)
		}
		label := regexp.MustCompile(`<text class="unknown"[^>]*>([^<]*)</text>`).FindStringSubmatch(out)
		if (label == nil) != (c.say == "") || (label != nil && label[1] != c.say) {
			t.Errorf("since %s ago: the shade says %q, want %q", c.before, label, c.say)
		}
	}
	ch := testChart(series{Name: "a", Points: pts(1, 2)})
	ch.Since = chartNow.Add(-2 * time.Hour)
	if strings.Contains(string(ch.svg()), "unknown") {
		t.Error("a console older than the hour shades some of it")
	}
}
