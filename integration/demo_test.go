package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds cmd/demo, cmd/outboxctl and internal/cmd/chaos once per test run, in the
// library's module (the repository's root), whose go.mod is the one that covers their dependencies.
func binaries(t *testing.T) (demo, ctl string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "outboxkit-bin-")
		if buildErr != nil {
			return
		}
		for cmd, pkg := range map[string]string{"demo": "cmd/demo", "outboxctl": "cmd/outboxctl", "chaos": "internal/cmd/chaos"} {
			build := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), "./"+pkg)
			build.Dir = ".."
			out, err := build.CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", cmd, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "demo"), filepath.Join(binDir, "outboxctl")
}

type demoProc struct {
	url    string
	cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
	exited chan struct{}
}

// startDemo runs the demo binary serving on a free port in schema, until stop or the test's end.
func startDemo(t *testing.T, pg *testenv.PG, amqpURL string, args ...string) *demoProc {
	t.Helper()
	return runDemo(t, nil, append([]string{"--db", pg.URL, "--broker", amqpURL, "--schema", string(pg.Schema), "--addr", "127.0.0.1:0",
		"--serve", "--orders", "0", "--status-every", "0"}, args...)...)
}

// runDemo runs the demo binary with args and env (NAME=value, added to the test's environment)
// until stop or the test's end, and returns once it serves: args must make it serve (--serve).
func runDemo(t *testing.T, env []string, args ...string) *demoProc {
	t.Helper()
	demo, _ := binaries(t)
	d := &demoProc{cmd: exec.Command(demo, args...), exited: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), env...)
	stdout, _ := d.cmd.StdoutPipe()
	d.cmd.Stderr = &lockedWriter{d}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	go func() {
		defer close(d.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.output.WriteString(line + "\n")
			d.mu.Unlock()
			if rest, ok := strings.CutPrefix(line, "outboxkit demo on "); ok {
				urls <- strings.Fields(rest)[0]
			}
		}
		_ = d.cmd.Wait()
	}()
	t.Cleanup(func() { d.stop(t) })
	select {
	case d.url = <-urls:
	case <-d.exited:
		t.Fatalf("demo exited at start:\n%s", d.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("demo did not start within 60s:\n%s", d.log())
	}
	return d
}

type lockedWriter struct{ d *demoProc }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.output.Write(p)
}

func (d *demoProc) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.output.String()
}

func (d *demoProc) stop(t *testing.T) {
	if d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("demo did not stop within 30s of SIGTERM:\n%s", d.log())
	}
}

func (d *demoProc) placeOrder(t *testing.T, key, customer string) (int, bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.url+"/orders", strings.NewReader(fmt.Sprintf(`{"customer":%q,"total_cents":1250}`, customer)))
	req.Header.Set(idempotency.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST /orders: %v", err)
		return 0, false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, idempotency.Replayed(resp)
}

// ctlStatus runs `outboxctl status --json`.
type ctlStatus struct {
	Outbox struct {
		Pending      int `json:"pending"`
		DeadLettered int `json:"dead_lettered"`
	} `json:"outbox"`
	Consumers []struct {
		Consumer    string `json:"consumer"`
		Processed   int    `json:"processed"`
		Duplicates  int    `json:"duplicates"`
		DeadLetters int    `json:"dead_letters"`
	} `json:"consumers"`
}

func outboxctl(t *testing.T, pg *testenv.PG, args ...string) (string, int) {
	t.Helper()
	_, ctl := binaries(t)
	cmd := exec.Command(ctl, append([]string{"--db", pg.URL, "--schema", string(pg.Schema)}, args...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func status(t *testing.T, pg *testenv.PG) ctlStatus {
	t.Helper()
	out, code := outboxctl(t, pg, "status", "--json")
	var s ctlStatus
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil {
		t.Fatalf("outboxctl status --json: exit %d\n%s", code, out)
	}
	return s
}

func (s ctlStatus) consumer(name string) (processed, duplicates, dead int) {
	for _, c := range s.Consumers {
		if c.Consumer == name {
			return c.Processed, c.Duplicates, c.DeadLetters
		}
	}
	return 0, 0, 0
}

var demoConsumers = []string{"shipping", "billing", "search"}

// newDemoEnv is a demo's database schema (empty: the demo migrates it) and RabbitMQ, with what the
// demo makes cleaned up when the test ends: its topic's exchange and queues, and the schema of its
// payment gateway, whose quoted name is returned.
func newDemoEnv(t *testing.T) (pg *testenv.PG, amqpURL, gatewaySchema string) {
	t.Helper()
	pg = testenv.NewEmptyPG(t)
	amqpURL = testenv.AMQPURL(t)
	testenv.DeleteWhenDone(t, amqpURL, string(pg.Schema)+".orders", demoConsumers...)
	gatewaySchema = `"` + string(pg.Schema) + `_gateway"`
	t.Cleanup(func() { _, _ = pg.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+gatewaySchema+" CASCADE") })
	return pg, amqpURL, gatewaySchema
}

// 500 orders through the demo binary, 10% retried with the same key (half of those concurrently):
// 500 orders, 500 shipments, 500 invoices, 500 search entries, no dead letters.
func TestDemo_FiveHundredOrdersEndToEnd(t *testing.T) {
	t.Parallel()
	pg, url, _ := newDemoEnv(t)
	d := startDemo(t, pg, url)

	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var mu sync.Mutex
	replayed := 0
	for i := 0; i < 500; i++ {
		key := uuid.NewString()
		sends := 1
		if i%10 == 0 {
			sends = 2 // a retry with the same key
		}
		for s := 0; s < sends; s++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code, again := d.placeOrder(t, key, fmt.Sprintf("customer-%d", i))
				if code != http.StatusCreated {
					t.Errorf("order %d: status %d", i, code)
				}
				if again {
					mu.Lock()
					replayed++
					mu.Unlock()
				}
			}()
			if s == 0 && i%20 == 0 {
				wg.Wait() // every other retried key: the retry comes after the first answer
			}
		}
	}
	wg.Wait()
	if replayed != 50 {
		t.Errorf("%d retried POSTs answered from the idempotency record, want 50", replayed)
	}
	testenv.Eventually(t, 120*time.Second, "every consumer to process 500 orders", func() bool {
		s := status(t, pg)
		for _, c := range demoConsumers {
			if p, _, _ := s.consumer(c); p < 500 {
				return false
			}
		}
		return s.Outbox.Pending == 0
	})
	s := status(t, pg)
	for _, c := range demoConsumers {
		if p, _, dead := s.consumer(c); p != 500 || dead != 0 {
			t.Errorf("%s: processed %d, dead letters %d; want 500 and 0", c, p, dead)
		}
	}
	if s.Outbox.DeadLettered != 0 {
		t.Errorf("%d outbox dead letters", s.Outbox.DeadLettered)
	}
	for table, want := range map[string]int{"orders": 500, "shipments": 500, "invoices": 500, "search_entries": 500} {
		if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.`+table); n != want {
			t.Errorf("%s: %d rows, want %d", table, n, want)
		}
	}
	// Drained, the broker holds nothing for any consumer; outboxctl reads it per consumer.
	topic := string(pg.Schema) + ".orders"
	testenv.Eventually(t, 30*time.Second, "outboxctl status --broker to show empty queues", func() bool {
		out, code := outboxctl(t, pg, "status", "--json", "--broker", url, "--topic", topic)
		var st struct {
			Brokers []struct {
				Consumer string
				Topic    string
				Waiting  int64
				Error    string
			}
		}
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Brokers) != len(demoConsumers) {
			t.Fatalf("outboxctl status --broker: exit %d\n%s", code, out)
		}
		for _, b := range st.Brokers {
			if b.Error != "" || b.Topic != topic {
				t.Fatalf("outboxctl status --broker: %+v", b)
			}
			if b.Waiting != 0 {
				return false
			}
		}
		return true
	})
}

// A fault switch dead-letters a message; outboxctl lists it; after the cause is fixed, replay sends
// it and it is processed once; replayed again it is absorbed as a duplicate.
func TestDemo_OutboxctlDeadLetterRoundTrip(t *testing.T) {
	t.Parallel()
	pg, url, _ := newDemoEnv(t)

	d := startDemo(t, pg, url, "--reject-customer", "mallory")
	if code, _ := d.placeOrder(t, uuid.NewString(), "mallory"); code != http.StatusCreated {
		t.Fatalf("order: %d", code)
	}
	testenv.Eventually(t, 60*time.Second, "billing to dead-letter mallory's order", func() bool {
		_, _, dead := status(t, pg).consumer("billing")
		return dead == 1
	})
	out, code := outboxctl(t, pg, "inbox", "dead", "list", "--consumer", "billing", "--json")
	var letters []struct {
		ID        int64
		MessageID string
		Reason    string
	}
	if code != 0 || json.Unmarshal([]byte(out), &letters) != nil || len(letters) != 1 || !strings.Contains(letters[0].Reason, "no billing account") {
		t.Fatalf("inbox dead list: exit %d\n%s", code, out)
	}

	d.stop(t) // fix the cause: Billing accepts mallory again
	startDemo(t, pg, url)
	if out, code := outboxctl(t, pg, "inbox", "dead", "replay", "--consumer", "billing", "--broker", url); code != 0 || !strings.Contains(out, "replayed 1 messages") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	testenv.Eventually(t, 60*time.Second, "the replayed message to be invoiced", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices`) == 1
	})
	_, dupBefore, _ := status(t, pg).consumer("billing")
	if out, code := outboxctl(t, pg, "inbox", "dead", "replay", "--consumer", "billing", "--again", "--broker", url); code != 0 || !strings.Contains(out, "replayed 1 messages") {
		t.Fatalf("second replay: exit %d\n%s", code, out)
	}
	testenv.Eventually(t, 60*time.Second, "the second replay to be absorbed as a duplicate", func() bool {
		_, dup, _ := status(t, pg).consumer("billing")
		return dup == dupBefore+1
	})
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices`); n != 1 {
		t.Fatalf("%d invoices after two replays, want 1", n)
	}
	if p, _, dead := status(t, pg).consumer("billing"); p != 1 || dead != 0 {
		t.Fatalf("billing processed %d, dead letters %d; want 1 and 0", p, dead)
	}
}

// /readyz turns false when the relay is stopped and the backlog ages past the threshold, and true
// again once the relay runs and drains it.
func TestDemo_ReadinessFollowsTheBacklog(t *testing.T) {
	t.Parallel()
	pg, url, _ := newDemoEnv(t)
	d := startDemo(t, pg, url, "--ready-max-pending-age", "1s")
	ready := func() bool {
		resp, err := http.Get(d.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !ready() {
		t.Fatal("not ready at start")
	}
	post := func(path string) {
		resp, err := http.Post(d.url+path, "", nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST %s: %v", path, err)
		}
		resp.Body.Close()
	}
	post("/admin/relay/stop")
	d.placeOrder(t, uuid.NewString(), "ada")
	testenv.Eventually(t, 30*time.Second, "/readyz to fail with the relay stopped", func() bool { return !ready() })
	post("/admin/relay/start")
	testenv.Eventually(t, 30*time.Second, "/readyz to recover once the relay drains the backlog", ready)
}

// An update of an existing order (POST /orders/{id}/cancel) locks the order's row and bumps its
// version before it writes the event: two cancellations sent at once give one OrderCancelled, with
// version 2, behind the OrderPlaced of version 1; every consumer applies both, in that order.
func TestDemo_CancelLocksTheOrderAndCarriesTheNextVersion(t *testing.T) {
	t.Parallel()
	pg, url, _ := newDemoEnv(t)
	d := startDemo(t, pg, url)

	resp, err := http.Post(d.url+"/orders", "application/json", strings.NewReader(`{"customer":"ada","total_cents":900}`))
	if err != nil {
		t.Fatal(err)
	}
	var placed struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&placed)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || placed.ID == "" {
		t.Fatalf("POST /orders: %d", resp.StatusCode)
	}
	codes := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func() {
			resp, err := http.Post(d.url+"/orders/"+placed.ID+"/cancel", "", nil)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	got := map[int]int{}
	for i := 0; i < 2; i++ {
		got[<-codes]++
	}
	if got[http.StatusOK] != 1 || got[http.StatusConflict] != 1 {
		t.Fatalf("two concurrent cancellations answered %v; want one 200 and one 409", got)
	}
	versions := pg.Int(t, `SELECT count(*) FROM (SELECT metadata::jsonb->>'outboxkit_version' AS v,
		metadata::jsonb->>'outboxkit_event_type' AS e, row_number() OVER (ORDER BY seq) AS n
		FROM {{schema}}.outbox WHERE partition_key = $1) AS x
		WHERE (n = 1 AND v = '1' AND e = 'OrderPlaced') OR (n = 2 AND v = '2' AND e = 'OrderCancelled')`, placed.ID)
	if versions != 2 {
		t.Fatalf("the order's outbox rows are not OrderPlaced v1 then OrderCancelled v2")
	}
	testenv.Eventually(t, 60*time.Second, "every consumer to apply the cancellation", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.shipments WHERE cancelled_at IS NOT NULL`) == 1 &&
			pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices WHERE refunded_at IS NOT NULL`) == 1 &&
			pg.Int(t, `SELECT count(*) FROM {{schema}}.search_entries WHERE document LIKE '%cancelled'`) == 1
	})
}

// The README's first command needs no server: the demo's defaults (a SQLite file, the in-process
// broker) run 200 orders through every consumer in a network namespace of its own, where no
// database or broker of this machine can be reached.
func TestDemo_DefaultNeedsNoServer(t *testing.T) {
	t.Parallel()
	demo, _ := binaries(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is needed to cut the demo off every server: %v", err)
	}
	dir := t.TempDir()
	// In the namespace: loopback up (the demo serves HTTP on it), then prove that Postgres,
	// MariaDB and RabbitMQ are out of reach, then run the demo with its defaults.
	script := `ip link set lo up || exit 90
for port in 5432 3306 5672; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port reachable in the namespace"; exit 91; fi
done
exec "$0" --addr 127.0.0.1:0 --status-every 0`
	cmd := exec.Command("unshare", "-rn", "bash", "-c", script, demo)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OUTBOXKIT_DATABASE_URL=", "OUTBOXKIT_BROKER_URL=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("the demo with no server: %v after %s\n%s", err, elapsed, out)
	}
	want := "done: 200 orders placed; shipping 200, billing 200, search 200, duplicates absorbed 0, dead letters 0."
	if !strings.Contains(string(out), want) {
		t.Fatalf("the demo's output lacks %q:\n%s", want, out)
	}
	if _, err := os.Stat(filepath.Join(dir, ".cache", "outboxkit-demo.db")); err != nil {
		t.Fatalf("the demo's database is not under .cache: %v", err)
	}
	t.Logf("200 orders through the embedded demo in %s (includes start-up)", elapsed.Round(10*time.Millisecond))
}

// The demo's parts as separate processes, as the chaos soak runs them: the order service, two
// relays, and the consumers split over two processes (Billing charging the order service's payment
// gateway). Every order reaches every consumer once.
func TestDemo_PartsAsSeparateProcesses(t *testing.T) {
	t.Parallel()
	pg, url, gateway := newDemoEnv(t)

	orders := startDemo(t, pg, url, "--role", "orders")
	startDemo(t, pg, url, "--role", "relay", "--relay-name", "r1")
	startDemo(t, pg, url, "--role", "relay", "--relay-name", "r2")
	startDemo(t, pg, url, "--role", "consumers", "--consumers", "shipping,search")
	startDemo(t, pg, url, "--role", "consumers", "--consumers", "billing", "--gateway", orders.url+"/gateway/charges")
	for i := range 60 {
		if code, _ := orders.placeOrder(t, uuid.NewString(), fmt.Sprintf("customer-%d", i)); code != http.StatusCreated {
			t.Fatalf("order %d: status %d", i, code)
		}
	}
	testenv.Eventually(t, 90*time.Second, "every consumer to apply the 60 orders", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.shipments`) == 60 && pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices`) == 60 &&
			pg.Int(t, `SELECT count(*) FROM {{schema}}.search_entries`) == 60
	})
	if n := pg.Int(t, `SELECT count(DISTINCT order_id) FROM `+gateway+`.gateway_charges`); n != 60 {
		t.Fatalf("%d orders charged at the gateway, want 60", n)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != 0 {
		t.Fatalf("%d events still pending", n)
	}
}

// The demo with the binlog relay: --relay log on a mysql:// --db whose server keeps the binary log
// reads the outbox's rows from it (forwarder/mysqlbinlog) and removes each once published; every
// order reaches every consumer, no row is left and the relay group has its checkpoint. --relay-mode
// wal, Postgres's, is refused on MySQL.
func TestDemo_BinlogRelayOnMySQL(t *testing.T) {
	t.Parallel()
	server := testenv.MySQLBinlogURL(t)
	demo, _ := binaries(t)
	schema := testenv.UniqueName(t, "demo")
	admin := testenv.OpenMySQL(t, server)
	t.Cleanup(func() {
		for _, db := range []string{schema, schema + "_gateway"} {
			_, _ = admin.Exec("DROP DATABASE IF EXISTS `" + db + "`")
		}
	})
	out, err := exec.Command(demo, "--db", server, "--schema", schema, "--broker", "memory://", "--relay", "log",
		"--orders", "40", "--addr", "127.0.0.1:0", "--status-every", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("the demo with the binlog relay: %v\n%s", err, out)
	}
	if want := "done: 40 orders placed; shipping 40, billing 40, search 40,"; !strings.Contains(string(out), want) {
		t.Fatalf("the demo's output lacks %q:\n%s", want, out)
	}
	count := func(query string) int {
		var n int
		if err := admin.QueryRow(query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("SELECT COUNT(*) FROM `" + schema + "`.outbox"); n != 0 {
		t.Errorf("%d outbox rows left: the binlog relay removes each row it published", n)
	}
	if n := count("SELECT COUNT(*) FROM `" + schema + "`.binlog_relays WHERE name = 'demo'"); n != 1 {
		t.Errorf("%d checkpoints of relay group demo, want 1", n)
	}

	out, err = exec.Command(demo, "--db", server, "--relay", "log", "--relay-mode", "wal").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--relay-mode wal is Postgres's") {
		t.Errorf("--relay-mode wal on MySQL: %v, want exit 2 saying it is Postgres's:\n%s", err, out)
	}
}
