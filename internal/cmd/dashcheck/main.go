// Command dashcheck checks the Grafana dashboard in deploy/grafana against what outboxkit really
// exports: every query is valid PromQL (promtool checks it as a recording rule's expression), and
// every metric and label it reads is one the demo's /metrics serves, with the demo relaying
// orders through Kafka in transactions, so that a renamed metric or label cannot silently empty a
// panel. make alerts runs it.
//
//	go run ./internal/cmd/dashcheck [--broker kafka://127.0.0.1:9092] deploy/grafana/outboxkit.json
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	broker := flag.String("broker", envOr("OUTBOXKIT_TEST_KAFKA_URL", "kafka://127.0.0.1:9092"), "the Kafka the demo relays to (kfake: scripts/services.sh kafka)")
	promtool := flag.String("promtool", "scripts/promtool.sh", "promtool, to check each query's syntax")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: dashcheck [--broker URL] DASHBOARD.json")
		os.Exit(2)
	}
	if err := check(flag.Arg(0), *broker, *promtool); err != nil {
		fmt.Fprintln(os.Stderr, "dashcheck:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// dashboard is what dashcheck reads of a Grafana dashboard.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// query is one PromQL expression of the dashboard, and where it is.
type query struct{ where, expr string }

func check(path, broker, promtool string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var queries []query
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			queries = append(queries, query{where: "panel " + p.Title, expr: t.Expr})
		}
	}
	// label_values(metric, label) of the variables: the metric, and the label on it.
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	var varChecks [][3]string
	for _, v := range d.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		s, _ := q["query"].(string)
		if m := labelValues.FindStringSubmatch(s); m != nil {
			varChecks = append(varChecks, [3]string{"variable " + v.Name, m[1], m[2]})
		} else if s != "" {
			return fmt.Errorf("variable %s: a query dashcheck cannot read (%q): use label_values(metric, label)", v.Name, s)
		}
	}
	if len(queries) == 0 {
		return fmt.Errorf("%s holds no query", path)
	}
	if err := checkSyntax(queries, promtool); err != nil {
		return err
	}
	series, err := demoMetrics(broker, queries, varChecks)
	if err != nil {
		return err
	}
	var problems []string
	for _, q := range queries {
		problems = append(problems, checkQuery(q, series)...)
	}
	for _, v := range varChecks {
		if !series.has(v[1], v[2]) {
			problems = append(problems, fmt.Sprintf("%s: the demo exports no %s with label %s", v[0], v[1], v[2]))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	fmt.Printf("dashcheck: %d queries and %d variables of %s read only what the demo exports\n", len(queries), len(varChecks), path)
	return nil
}

// grafanaVars are the dashboard's variables: Grafana's own and the template's.
var grafanaVars = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)

// promQL is expr with Grafana's variables replaced as Grafana would: intervals by one, a
// variable in a matcher by "match anything".
func promQL(expr string) string {
	expr = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(expr)
	return grafanaVars.ReplaceAllString(expr, ".*")
}

// checkSyntax has promtool check every query, as the expression of a recording rule.
func checkSyntax(queries []query, promtool string) error {
	dir, err := os.MkdirTemp("", "dashcheck")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range queries {
		e, _ := json.Marshal(promQL(q.expr)) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard:query_%d\n        expr: %s\n", i, e)
	}
	file := filepath.Join(dir, "dashboard_rules.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return err
	}
	out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
	return nil
}

// seriesSet is the demo's /metrics: each series name and the label names its series carry.
type seriesSet map[string]map[string]bool

func (s seriesSet) has(name, label string) bool {
	labels, ok := s[name]
	return ok && (label == "" || labels[label])
}

var (
	metricName = regexp.MustCompile(`\b(outboxkit|demo)_[a-zA-Z0-9_:]+`)
	matchers   = regexp.MustCompile(`\b((?:outboxkit|demo)_[a-zA-Z0-9_:]+)\{([^}]*)\}`)
	byLabels   = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	labelName  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// checkQuery says what q reads that the demo does not export: a metric, a label of a matcher, a
// label it groups by.
func checkQuery(q query, s seriesSet) []string {
	var problems []string
	names := metricName.FindAllString(q.expr, -1)
	for _, n := range names {
		if !s.has(n, "") {
			problems = append(problems, fmt.Sprintf("%s: the demo exports no %s", q.where, n))
		}
	}
	for _, m := range matchers.FindAllStringSubmatch(q.expr, -1) {
		for _, l := range labelName.FindAllStringSubmatch(m[2], -1) {
			if s.has(m[1], "") && !s.has(m[1], l[1]) {
				problems = append(problems, fmt.Sprintf("%s: %s has no label %s", q.where, m[1], l[1]))
			}
		}
	}
	for _, m := range byLabels.FindAllStringSubmatch(q.expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			l = strings.TrimSpace(l)
			if l == "" || l == "le" && strings.Contains(q.expr, "_bucket") {
				continue
			}
			if !slices.ContainsFunc(names, func(n string) bool { return s.has(n, l) }) {
				problems = append(problems, fmt.Sprintf("%s: groups by %s, which none of %v carries", q.where, l, names))
			}
		}
	}
	return problems
}

// demoMetrics runs the demo — SQLite, Kafka with a transactional relay — until its /metrics
// serves every metric the dashboard reads (or a minute has passed), and returns what it serves.
func demoMetrics(broker string, queries []query, vars [][3]string) (seriesSet, error) {
	dir, err := os.MkdirTemp("", "dashcheck-demo")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "demo")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/demo").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the demo: %v\n%s", err, out)
	}
	id := fmt.Sprintf("dashcheck_%d", time.Now().UnixNano()%1e9)
	sep := "?"
	if strings.Contains(broker, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--db", "sqlite://"+filepath.Join(dir, "demo.db"), "--schema", id,
		"--broker", broker+sep+"transactional_id="+id, "--serve", "--orders", "30", "--addr", "127.0.0.1:0", "--status-every", "0")
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer dropTopics(broker, id+".orders", "outboxkit.progress."+id)
	defer func() { _ = cmd.Wait() }()
	defer cancel()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`outboxkit demo on (http://\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addrc <- m[1]:
				default:
				}
			}
		}
	}()
	var base string
	select {
	case base = <-addrc:
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("the demo did not start within 60s:\n%s", stderr.String())
	}
	want := map[string]bool{}
	for _, q := range queries {
		for _, n := range metricName.FindAllString(q.expr, -1) {
			want[n] = true
		}
	}
	for _, v := range vars {
		want[v[1]] = true
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := scrape(base + "/metrics")
		if err == nil {
			missing := 0
			for n := range want {
				if !s.has(n, "") {
					missing++
				}
			}
			if missing == 0 || time.Now().After(deadline) {
				return s, nil // what is still missing, checkQuery names
			}
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("scrape the demo's /metrics: %w", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// scrape reads a /metrics page in Prometheus's text format: each series' name and label names.
func scrape(url string) (seriesSet, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	s := seriesSet{}
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name = strings.Fields(name)[0]
		if s[name] == nil {
			s[name] = map[string]bool{}
		}
		if labels, _, ok := strings.Cut(rest, "}"); ok {
			for _, m := range label.FindAllStringSubmatch(labels, -1) {
				s[name][m[1]] = true
			}
		}
	}
	return s, nil
}

// dropTopics deletes the demo's topics from the Kafka at broker, once it has stopped.
func dropTopics(broker string, topics ...string) {
	host := strings.TrimPrefix(strings.SplitN(broker, "?", 2)[0], "kafka://")
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(host, ",")...))
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topics...)
}
