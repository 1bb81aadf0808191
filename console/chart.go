package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// A chart is a few series over the last Span, drawn by svg as an inline SVG the server writes:
// no script, no charting library, nothing to build. Every name in it is escaped (topic and
// consumer names are anyone's).
type chart struct {
	ID    string // unique on the page: the figure's id, and the prefix of its SVG's title and description
	Title string // what is drawn: "Outbox pending"
	Sub   string // what the series are: "rows, per topic"
	Unit  string // the y axis's unit: "rows"
	Whole bool   // the values are counts: the y axis's ticks are whole numbers
	Now   time.Time
	Span  time.Duration // the x axis runs from Span ago to Now, in minutes ago
	// Since is when what the series know begins (a console's first sample): the time before it
	// within the window is shaded and said to be unknown, in the words of Unknown where they fit
	// ("not sampled" otherwise). Zero: none.
	Since   time.Time
	Unknown string
	// Series are drawn in order, at most len(seriesClasses) of them in colours and dashes of
	// their own; Other is drawn grey.
	Series []series
	// Empty is what the plot says when no series has a point in the window: why there is nothing
	// yet ("No data yet: …").
	Empty string
}

type series struct {
	Name   string
	Other  bool    // the sum of the series not drawn on their own ("4 other topics")
	Class  string  // its colour and dash (console.css: s0…s5, so, sx); default by its place
	Points []point // oldest first; a NaN value breaks the line (no figure then)
}

type point struct {
	At time.Time
	V  float64
}

// The SVG's coordinate system: it scales to its figure's width, at most 680 px (console.css), where
// 11 units of text are 14 px.
const (
	chartW, chartH   = 520.0, 190.0
	plotX0, plotX1   = 48.0, 506.0
	plotY0, plotY1   = 20.0, 154.0
	chartFont        = 11.0
	emptyTextWidth   = 400.0 // the empty state's lines, at most
	seriesClassCount = 6
	xTickEvery       = 15 * time.Minute
	tickTolerance    = 1e-9 // floating point's error in a tick's arithmetic
)

// niceScale is the top of the y axis and the step between its ticks for values up to peak: a
// step of 1, 2, 2.5 or 5 times a power of ten (no 2.5 for whole numbers), 2 or 3 steps to the
// top, so the axis has 3 or 4 ticks and the peak uses more than a third of the height.
func niceScale(peak float64, whole bool) (top, step float64) {
	if !(peak > 0) || math.IsInf(peak, 0) {
		peak = 0
	}
	switch {
	case whole && peak <= 3:
		return 3, 1
	case peak == 0:
		return 1, 0.5
	}
	raw := peak / 3
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		s := m * mag
		if whole && s != math.Trunc(s) {
			continue
		}
		if s >= raw*(1-tickTolerance) {
			step = s
			break
		}
	}
	top = step * math.Ceil(peak/step-tickTolerance)
	return top, step
}

// tickLabel writes v, a multiple of step, as short as its precision allows: 0.25, 7,500, 15k, 2.5M.
func tickLabel(v, step, top float64) string {
	if v == 0 {
		return "0"
	}
	div, suffix := 1.0, ""
	switch {
	case top >= 10e6:
		div, suffix = 1e6, "M"
	case top >= 10e3:
		div, suffix = 1e3, "k"
	}
	v, step = v/div, step/div
	dec := 0
	for s := step; dec < 6 && math.Abs(s-math.Round(s)) > tickTolerance*math.Max(1, s); s *= 10 {
		dec++
	}
	if dec == 0 && suffix == "" {
		return commas(int64(math.Round(v)))
	}
	return strconv.FormatFloat(v, 'f', dec, 64) + suffix
}

// figure writes v for a legend or a description: whole numbers with commas, rates with two
// figures below 10 (0.03, 2.5), none from 100.
func figure(v float64, whole bool) string {
	switch {
	case math.IsNaN(v):
		return "no figure"
	case whole || v >= 100:
		return commas(int64(math.Round(v)))
	case v < 1 && v > 0:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// latest and peak are a series' last figure and its largest within the window; ok is false when
// it has none.
func (c chart) latestAndPeak(s series) (latest, peak float64, ok bool) {
	from := c.Now.Add(-c.Span)
	for _, p := range s.Points {
		if math.IsNaN(p.V) || math.IsInf(p.V, 0) || p.At.Before(from) {
			continue
		}
		latest = p.V
		if !ok || p.V > peak {
			peak = p.V
		}
		ok = true
	}
	return latest, peak, ok
}

// seriesClass is the CSS class that colours and dashes the i-th series (console.css).
func seriesClass(i int, s series) string {
	switch {
	case s.Class != "":
		return s.Class
	case s.Other:
		return "so"
	}
	return "s" + strconv.Itoa(i%seriesClassCount)
}

// svg draws the chart as a figure: a caption, the SVG (labelled for a screen reader by its title
// and a description that says each series' latest and largest figure), and a legend when there
// is more than one series.
func (c chart) svg() template.HTML {
	esc := template.HTMLEscapeString
	var b strings.Builder
	var peak float64
	var drawn bool
	var desc []string
	for _, s := range c.Series {
		latest, p, ok := c.latestAndPeak(s)
		if !ok {
			continue
		}
		drawn = true
		peak = max(peak, p)
		desc = append(desc, fmt.Sprintf("%s: now %s, at most %s", s.Name, figure(latest, c.Whole), figure(p, c.Whole)))
	}
	minutes := int(c.Span / time.Minute)
	label := fmt.Sprintf("%s over the last %d minutes, in %s", c.Title, minutes, c.Unit)
	description := c.Empty
	if drawn {
		description = strings.Join(desc, "; ") + "."
	}
	fmt.Fprintf(&b, `<figure class="chart" id="%s"><figcaption><span class="chart-title">%s</span> <span class="faint">%s</span>`,
		esc(c.ID), esc(c.Title), esc(c.Sub))
	if len(c.Series) == 1 { // no legend: its figure now in the caption
		if latest, _, ok := c.latestAndPeak(c.Series[0]); ok {
			fmt.Fprintf(&b, ` <span class="chart-now">%s now: <b>%s</b> %s</span>`, esc(c.Series[0].Name), figure(latest, c.Whole), esc(c.Unit))
		}
	}
	b.WriteString(`</figcaption>`)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %g %g" role="img" aria-label="%s" aria-describedby="%s-desc" data-series="%d">`,
		chartW, chartH, esc(label), esc(c.ID), len(c.Series))
	fmt.Fprintf(&b, `<title>%s</title><desc id="%s-desc">%s</desc>`, esc(label), esc(c.ID), esc(description))

	unknown := !c.Since.IsZero() && c.Since.After(c.Now.Add(-c.Span))
	if unknown {
		fmt.Fprintf(&b, `<rect class="unknown" x="%g" y="%g" width="%.1f" height="%g"/>`, plotX0, plotY0, c.x(c.Since)-plotX0, plotY1-plotY0)
	}

	// The x axis: minutes ago, a tick every 15, "now" at the right.
	b.WriteString(`<g class="axis x">`)
	for ago := time.Duration(0); ago <= c.Span; ago += xTickEvery {
		x := c.x(c.Now.Add(-ago))
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%g" x2="%.1f" y2="%g"/>`, x, plotY0, x, plotY1)
		text := strconv.Itoa(int(ago / time.Minute))
		if ago == 0 {
			text = "now"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, x, plotY1+18, text)
	}
	fmt.Fprintf(&b, `<text class="axis-title" x="%g" y="%g" text-anchor="middle">minutes ago</text></g>`, (plotX0+plotX1)/2, chartH-2)

	if !drawn {
		fmt.Fprintf(&b, `<line class="base" x1="%g" y1="%g" x2="%g" y2="%g"/>`, plotX0, plotY1, plotX1, plotY1)
		c.emptyText(&b)
		b.WriteString(`</svg></figure>`)
		return template.HTML(b.String())
	}

	// The y axis: 3 or 4 ticks from 0, the unit above them.
	top, step := niceScale(peak, c.Whole)
	b.WriteString(`<g class="axis y">`)
	for i := 0; float64(i)*step <= top*(1+tickTolerance); i++ {
		v := float64(i) * step
		y := c.y(v, top)
		class := "grid"
		if i == 0 {
			class = "base"
		}
		fmt.Fprintf(&b, `<line class="%s" x1="%g" y1="%.1f" x2="%g" y2="%.1f"/>`, class, plotX0, y, plotX1, y)
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" dy="0.35em" text-anchor="end">%s</text>`, plotX0-6, y, tickLabel(v, step, top))
	}
	fmt.Fprintf(&b, `<text class="unit" x="%g" y="%g">%s</text></g>`, plotX0, plotY0-8, esc(c.Unit))
	if unknown { // over the grid, which its halo (console.css) keeps off its letters
		x := c.x(c.Since)
		for _, say := range []string{c.Unknown, "not sampled"} {
			if say != "" && float64(len(say))*chartFont*0.55+16 <= x-plotX0 { // an average glyph is about 0.55 em wide
				fmt.Fprintf(&b, `<text class="unknown" x="%.1f" y="%g" text-anchor="middle">%s</text>`, (plotX0+x)/2, (plotY0+plotY1)/2, esc(say))
				break
			}
		}
	}

	single := len(c.Series) == 1
	for i, s := range c.Series {
		class := seriesClass(i, s)
		latest, p, ok := c.latestAndPeak(s)
		if !ok {
			continue
		}
		fmt.Fprintf(&b, `<g class="series %s" data-name="%s"><title>%s: now %s %s, at most %s</title>`,
			class, esc(s.Name), esc(s.Name), figure(latest, c.Whole), esc(c.Unit), figure(p, c.Whole))
		var last [2]float64
		for _, seg := range c.segments(s, top) {
			last = seg[len(seg)-1]
			if len(seg) == 1 {
				fmt.Fprintf(&b, `<circle class="dot" cx="%.1f" cy="%.1f" r="2.5"/>`, seg[0][0], seg[0][1])
				continue
			}
			pts := make([]string, len(seg))
			for j, xy := range seg {
				pts[j] = fmt.Sprintf("%.1f,%.1f", xy[0], xy[1])
			}
			if single {
				fmt.Fprintf(&b, `<polygon class="area" points="%.1f,%g %s %.1f,%g"/>`, seg[0][0], plotY1, strings.Join(pts, " "), last[0], plotY1)
			}
			fmt.Fprintf(&b, `<polyline class="line" points="%s"/>`, strings.Join(pts, " "))
		}
		fmt.Fprintf(&b, `<circle class="end" cx="%.1f" cy="%.1f" r="3"/></g>`, last[0], last[1])
	}
	b.WriteString(`</svg>`)

	if len(c.Series) > 1 {
		b.WriteString(`<ul class="chart-legend">`)
		for i, s := range c.Series {
			latest, _, ok := c.latestAndPeak(s)
			now := "—"
			if ok {
				now = figure(latest, c.Whole)
			}
			fmt.Fprintf(&b, `<li class="%s"><svg class="swatch" viewBox="0 0 24 10" aria-hidden="true"><line x1="1" y1="5" x2="23" y2="5"/></svg><span class="name">%s</span><span class="num">%s</span></li>`,
				seriesClass(i, s), esc(s.Name), now)
		}
		b.WriteString(`</ul>`)
	}
	b.WriteString(`</figure>`)
	return template.HTML(b.String())
}

// emptyText says Empty in the middle of the plot, on as few lines as fit, of even length.
func (c chart) emptyText(b *strings.Builder) {
	perLine := int(math.Floor(emptyTextWidth / (chartFont * 0.55))) // an average glyph is about 0.55 em wide
	lines := wrap(c.Empty, perLine)
	for width := len(c.Empty)/len(lines) + 1; len(lines) > 1 && width < perLine; width++ {
		if even := wrap(c.Empty, width); len(even) == len(lines) {
			lines = even
			break
		}
	}
	y := (plotY0+plotY1)/2 - float64(len(lines)-1)*chartFont*0.7
	b.WriteString(`<text class="empty" text-anchor="middle">`)
	for i, l := range lines {
		if i < len(lines)-1 {
			l += " " // the text's words stay apart for whoever reads it whole
		}
		fmt.Fprintf(b, `<tspan x="%g" y="%.1f">%s</tspan>`, (plotX0+plotX1)/2, y+float64(i)*chartFont*1.4, template.HTMLEscapeString(l))
	}
	b.WriteString(`</text>`)
}

// wrap breaks s between words into lines of at most width bytes (a longer word has its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

// x places t on the x axis: Span ago at the left, Now at the right.
func (c chart) x(t time.Time) float64 {
	f := 1 - float64(c.Now.Sub(t))/float64(c.Span)
	return plotX0 + min(1, max(0, f))*(plotX1-plotX0)
}

// y places v on the y axis, 0 at the bottom and top at the top.
func (c chart) y(v, top float64) float64 {
	return plotY1 - min(1, max(0, v/top))*(plotY1-plotY0)
}

// segments are the runs of a series' points within the window, as coordinates, broken where a
// figure is missing.
func (c chart) segments(s series, top float64) [][][2]float64 {
	from := c.Now.Add(-c.Span)
	var out [][][2]float64
	var cur [][2]float64
	for _, p := range s.Points {
		if math.IsNaN(p.V) || math.IsInf(p.V, 0) || p.At.Before(from) {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, [2]float64{c.x(p.At), c.y(p.V, top)})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
