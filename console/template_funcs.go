// The functions the templates call, and the formatting of numbers and durations they and the
// handlers share.

package console

import (
	"fmt"
	"html/template"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var placeholder = regexp.MustCompile(`‹[^›]*›`)

var jsonToken = regexp.MustCompile(`("(?:[^"\\]|\\.)*")(\s*:)?|\b(-?\d+(?:\.\d+)?|true|false|null)\b`)

var funcs = template.FuncMap{
	"pe":          url.PathEscape,
	"since":       func(t time.Time) time.Duration { return time.Since(t) },
	"commas":      func(v any) string { return commas(toInt64(v)) },
	"int64":       func(v any) int64 { return toInt64(v) },
	"human":       human,
	"ago":         func(t time.Time) string { return ago(time.Since(t)) },
	"agoD":        ago,
	"utc":         func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"utcShort":    func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	"utcShortDay": func(t time.Time) string { return t.UTC().Format("Mon 2 Jan 15:04 UTC") },
	"rate": func(f float64) string {
		if f >= 100 {
			return commas(int64(f + .5))
		}
		return strconv.FormatFloat(f, 'f', 1, 64)
	},
	"pct": func(f float64) string { return strconv.FormatFloat(max(2, f*100), 'f', 1, 64) },
	"pctOf": func(a, b int64) int64 {
		if b == 0 {
			return 0
		}
		return a * 100 / b
	},
	"sub": func(a, b int64) int64 { return a - b },
	"sev": func(s severity) string {
		return map[severity]string{sevOK: "ok", sevWarn: "warn", sevBad: "bad"}[s]
	},
	"envClass": func(env string) string {
		switch strings.ToLower(env) {
		case "production", "prod":
			return "prod"
		}
		return "staging"
	},
	"join":   strings.Join,
	"plural": func(n any, one, many string) string { return plural(int(min(toInt64(n), 2)), one, many) },
	"title":  title,
	"jobClass": func(s string) string {
		return map[string]string{"running": "warn", "preparing": "warn", "queued": "idle", "done": "ok", "cancelled": "idle", "failed": "bad", "cancelling": "warn"}[s]
	},
	"jobSym": func(s string) string {
		return map[string]string{"running": "▶", "preparing": "…", "queued": "…", "done": "✔", "cancelled": "■", "failed": "✖", "cancelling": "■"}[s]
	},
	// pattern shows a normalised error with its placeholders marked.
	"pattern": func(s string) template.HTML {
		esc := template.HTMLEscapeString(s)
		return template.HTML(placeholder.ReplaceAllStringFunc(esc, func(m string) string { return `<span class="ph">` + m + `</span>` }))
	},
	// json colours pretty-printed JSON (escaped first: payloads are untrusted).
	"json": func(s string) template.HTML {
		esc := template.HTMLEscapeString(s)
		// HTMLEscapeString turns " into &#34;: colour on the escaped text.
		esc = strings.ReplaceAll(esc, "&#34;", `"`)
		out := jsonToken.ReplaceAllStringFunc(esc, func(m string) string {
			sm := jsonToken.FindStringSubmatch(m)
			switch {
			case sm[1] != "" && sm[2] != "":
				return `<span class="jk">` + sm[1] + `</span>` + sm[2]
			case sm[1] != "":
				return `<span class="js">` + sm[1] + `</span>`
			}
			return `<span class="jn">` + m + `</span>`
		})
		return template.HTML(out)
	},
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case float64:
		return int64(x)
	}
	return 0
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// human says a duration the way a person says it: "3 h 12 m", "48 s", "120 ms".
func human(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d m %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d m", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%d d %d h", int(d.Hours())/24, int(d.Hours())%24)
}

// ago is "just now" or "3 m 4 s ago".
func ago(d time.Duration) string {
	if d < 5*time.Second {
		return "just now"
	}
	return human(d) + " ago"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func title(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
