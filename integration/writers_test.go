package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// writer is an order service in another language (tools/interop/writer.js, tools/writers/): argv
// is the command before its arguments, URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT.
type writer struct {
	name string
	argv []string
}

// missingTool skips the test naming what to install — or fails it under CI=true or
// OUTBOXKIT_REQUIRE_SERVICES (make test), where a missing tool is a broken setup, not a reason.
func missingTool(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
		t.Fatal("a missing tool is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg)
	}
	t.Skip(msg)
}

// nodeTool returns node, or skips naming scripts/tools.sh when it or the npm pg is missing.
func nodeTool(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missingTool(t, "node is not installed: install Node.js 18 or newer, then run scripts/tools.sh")
	}
	for _, module := range []string{"pg", "amqplib"} {
		if _, err := os.Stat(filepath.Join("..", "tools", "interop", "node_modules", module)); err != nil {
			missingTool(t, "the npm "+module+" is not installed in tools/interop: run scripts/tools.sh")
		}
	}
	return node
}

// writers returns the three writers, the Java one compiled into a directory of the test's.
func writers(t *testing.T) []writer {
	t.Helper()
	node := nodeTool(t)

	// Debian's python3-psycopg2 is for Debian's python3, which another python3 on PATH may hide.
	python := ""
	for _, candidate := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(candidate); err == nil && exec.Command(path, "-c", "import psycopg2").Run() == nil {
			python = path
			break
		}
	}
	if python == "" {
		missingTool(t, "no python3 imports psycopg2: run scripts/tools.sh (apt-get install python3-psycopg2)")
	}

	javac, errC := exec.LookPath("javac")
	java, errJ := exec.LookPath("java")
	if errC != nil || errJ != nil {
		missingTool(t, "javac or java is not installed: run scripts/tools.sh (apt-get install openjdk-17-jdk-headless)")
	}
	const jdbc = "/usr/share/java/postgresql.jar"
	if _, err := os.Stat(jdbc); err != nil {
		missingTool(t, "the PostgreSQL JDBC driver is not installed: run scripts/tools.sh (apt-get install libpostgresql-jdbc-java)")
	}
	classes := t.TempDir()
	if out, err := exec.Command(javac, "-d", classes, filepath.Join("..", "tools", "writers", "Writer.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac Writer.java: %v\n%s", err, out)
	}
	return []writer{
		{"node", []string{node, filepath.Join("..", "tools", "interop", "writer.js")}},
		{"python", []string{python, filepath.Join("..", "tools", "writers", "writer.py")}},
		{"java", []string{java, "-cp", classes + string(os.PathListSeparator) + jdbc, "Writer"}},
	}
}

// inboxLine is what tools/interop/inbox.js prints of a delivery it handled.
type inboxLine struct {
	ID          string `json:"id"`
	Redelivered bool   `json:"redelivered"`
	Applied     bool   `json:"applied"`
}

// runNodeInbox runs the Node.js inbox consumer for n deliveries and returns what it handled and how
// it exited.
func runNodeInbox(t *testing.T, node, amqpURL, queue string, pg *testenv.PG, n int, extra ...string) ([]inboxLine, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{filepath.Join("..", "tools", "interop", "inbox.js"), amqpURL, queue, pg.URL, string(pg.Schema), "node",
		fmt.Sprint(n)}, extra...)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var lines []inboxLine
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		var line inboxLine
		if jerr := json.Unmarshal([]byte(l), &line); jerr != nil {
			t.Fatalf("the Node.js consumer printed %q: %v\n%s", l, jerr, stderr.String())
		}
		lines = append(lines, line)
	}
	if err != nil {
		err = fmt.Errorf("%w: %s", err, stderr.String())
	}
	return lines, err
}

// Order services in Node.js (pg), Python (psycopg2) and Java (JDBC) each commit an order and its
// event in one transaction through publish(), and roll another back. The relay publishes the three
// committed events to RabbitMQ, each once, with the envelope a Go writer gives; the Go consumer
// stack and a Node.js consumer on the inbox contract each apply every event once — through a
// consumer that crashes after its commit and before its ack, and an event the relay publishes
// again.
func TestWriters_NodePythonJavaThroughTheRelayIntoGoAndNodeInboxes(t *testing.T) {
	t.Parallel()
	ws := writers(t)
	node := ws[0].argv[0]
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	pg.Exec(t, `CREATE TABLE {{schema}}.orders (id text PRIMARY KEY, writer text NOT NULL, total integer NOT NULL)`)
	createEffects(t, db)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "writers") + ".placed"
	testenv.DeclareQueue(t, url, topic, "billing")
	testenv.DeclareQueue(t, url, topic, "node")
	wire := testenv.BindQueue(t, url, topic)

	// The writers at once, each in a process of its own.
	type written struct{ id, traceparent string }
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		byKey = map[string]written{} // the committed order's id → its event
		errs  []error
	)
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			traceparent := fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			argv := append(append([]string(nil), w.argv...), pg.URL, string(pg.Schema), topic, w.name+"-1", w.name+"-2", traceparent)
			out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
			mu.Lock()
			defer mu.Unlock()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				err = fmt.Errorf("%w: %s", err, exit.Stderr)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("the %s writer: %w", w.name, err))
				return
			}
			byKey[w.name+"-1"] = written{id: strings.TrimSpace(string(out)), traceparent: traceparent}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.orders WHERE id IN ('node-1', 'python-1', 'java-1')`); n != 3 ||
		pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`) != 3 || pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) != 3 {
		t.Fatalf("%d of the 3 committed orders, %d orders, %d events: a rolled-back order or event survived, or a committed one is missing",
			n, pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`), pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`))
	}

	// The relay publishes the committed events, each once, with the Go writer's envelope.
	b := openBackend(t, url, backends.Options{})
	drainRelay(t, pg, b)
	for _, d := range wire.WaitFor(t, 3, 30*time.Second) {
		key := d.Headers[outboxkit.MetadataPartitionKey]
		w, ok := byKey[key]
		writerName, _, _ := strings.Cut(key, "-")
		var body struct {
			OrderID string `json:"order_id"`
			Writer  string `json:"writer"`
		}
		switch {
		case !ok || d.UUID != w.id:
			t.Errorf("published %s with key %q: not a committed event (%v)", d.UUID, key, byKey)
		case d.Headers[outboxkit.MetadataEventType] != "OrderPlaced" || d.Type != "OrderPlaced":
			t.Errorf("%s: event type %q (AMQP type %q), want OrderPlaced", key, d.Headers[outboxkit.MetadataEventType], d.Type)
		case d.Headers[outboxkit.MetadataContentType] != "application/json" || d.ContentType != "application/json":
			t.Errorf("%s: content type %q (AMQP %q), want application/json", key, d.Headers[outboxkit.MetadataContentType], d.ContentType)
		case d.Headers["traceparent"] != w.traceparent || d.Headers["x_writer"] != writerName:
			t.Errorf("%s: traceparent %q, x_writer %q; want %s, %s", key, d.Headers["traceparent"], d.Headers["x_writer"], w.traceparent, writerName)
		case d.Headers[outboxkit.MetadataCreatedAt] == "" || d.Headers[outboxkit.MetadataSeq] == "":
			t.Errorf("%s: no created_at or seq stamp in %v", key, d.Headers)
		case json.Unmarshal(d.Body, &body) != nil || body.OrderID != key || body.Writer != writerName:
			t.Errorf("%s: payload %s", key, d.Body)
		}
	}

	// The Go consumer stack applies each once, and reads the same envelope.
	var (
		goMu  sync.Mutex
		goGot = map[string]message.Metadata{}
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startEffectConsumer(t, ctx, db, b, topic, "billing", withHook(func(m *message.Message) {
		goMu.Lock()
		defer goMu.Unlock()
		goGot[m.UUID] = m.Metadata
	}))
	testenv.Eventually(t, 30*time.Second, "the Go consumer to apply the three events", func() bool { return countEffects(t, db, "billing") == 3 })
	goMu.Lock()
	for key, w := range byKey {
		if md := goGot[w.id]; outboxkit.EventType(&message.Message{Metadata: md}) != "OrderPlaced" || md.Get(outboxkit.MetadataPartitionKey) != key ||
			md.Get("traceparent") != w.traceparent {
			t.Errorf("the Go consumer read %s (%s) as %v", w.id, key, md)
		}
	}
	goMu.Unlock()

	// The Node.js consumer commits the first event's effect and inbox row, then dies before its ack;
	// started again, it gets that event redelivered and absorbs it, then applies the other two.
	first, err := runNodeInbox(t, node, url, topic+"_node", pg, 3, "--exit-after-first-commit")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || len(first) != 1 || !first[0].Applied {
		t.Fatalf("the crashing Node.js consumer: %v, handled %+v; want exit 3 after applying one", err, first)
	}
	again, err := runNodeInbox(t, node, url, topic+"_node", pg, 3)
	if err != nil {
		t.Fatalf("the Node.js consumer, started again: %v", err)
	}
	applied, absorbed := 0, 0
	for _, l := range again {
		switch {
		case l.ID == first[0].ID && l.Redelivered && !l.Applied:
			absorbed++
		case l.ID != first[0].ID && l.Applied:
			applied++
		default:
			t.Errorf("the Node.js consumer handled %+v (first run applied %s)", l, first[0].ID)
		}
	}
	if absorbed != 1 || applied != 2 || countEffects(t, db, "node") != 3 {
		t.Fatalf("started again, the Node.js consumer absorbed %d redelivery and applied %d events (%d effects); want 1 and 2 (3)",
			absorbed, applied, countEffects(t, db, "node"))
	}

	// The relay publishes the Java writer's event again, as after a crash between its publish and
	// its mark: both inboxes absorb it.
	java := byKey["java-1"].id
	pg.Exec(t, `UPDATE {{schema}}.outbox SET published_at = NULL WHERE uuid = $1::uuid`, java)
	drainRelay(t, pg, b)
	if got := wire.WaitFor(t, 4, 30*time.Second); len(got) != 4 || got[3].UUID != java {
		t.Fatalf("%d messages on the wire, the last %s; want the three and %s again", len(got), got[len(got)-1].UUID, java)
	}
	testenv.Eventually(t, 30*time.Second, "the Go consumer to absorb the event published again", func() bool {
		return pg.Int(t, `SELECT coalesce(sum(duplicates), 0) FROM {{schema}}.inbox WHERE consumer = 'billing'`) == 1
	})
	dup, err := runNodeInbox(t, node, url, topic+"_node", pg, 1)
	if err != nil || len(dup) != 1 || dup[0].ID != java || dup[0].Applied {
		t.Fatalf("the Node.js consumer handled %+v (%v); want %s absorbed (before: %+v, %+v)", dup, err, java, first, again)
	}
	for _, consumer := range []string{"billing", "node"} {
		if n := countEffects(t, db, consumer); n != 3 {
			t.Errorf("%s applied %d effects, want 3: one per committed order", consumer, n)
		}
	}
	if n := pg.Int(t, `SELECT coalesce(sum(duplicates), 0) FROM {{schema}}.inbox WHERE consumer = 'node'`); n != 2 {
		t.Errorf("the Node.js consumer's inbox counts %d duplicates, want 2 (the redelivery, the event published again)", n)
	}
	if n := len(wire.Received()); n != 4 {
		t.Errorf("%d messages on the wire, want 4", n)
	}
}
