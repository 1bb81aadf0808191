package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// TestMain runs outboxctl itself when a test starts this binary as a subprocess, so that a test
// can send it a real SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("OUTBOXCTL_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// tenantDB makes a migrated SQLite outbox holding n events and returns its URL.
func tenantDB(t *testing.T, dir, name string, n int) string {
	t.Helper()
	url := "sqlite://" + filepath.Join(dir, name+".db")
	if code, _, stderr := ctl(t, "--db", url, "migrate"); code != 0 {
		t.Fatalf("migrate %s: %s", name, stderr)
	}
	ctx := context.Background()
	s, err := store.Open(ctx, url, store.OpenOptions{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	for i := range n {
		if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", fmt.Sprint("order-", i), []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return url
}

// pending reads an outbox's backlog.
func pending(t *testing.T, url string) int {
	t.Helper()
	s, err := store.Open(context.Background(), url, store.OpenOptions{PollOnly: true, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.OutboxStats(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

// leasesHeld lists the leases of fleet that name an owner.
func leasesHeld(t *testing.T, fc store.FleetControl, fleetName string) []string {
	t.Helper()
	leases, _, err := fc.FleetLeases(context.Background(), fleetName)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, l := range leases {
		if l.Owner != "" {
			held = append(held, l.Outbox+"@"+l.Owner)
		}
	}
	return held
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// relayProcess is outboxctl relay run as a process of its own (TestMain runs main), killed at the
// test's end unless the test waited for it.
type relayProcess struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	exited         chan error
	waited         bool
	base           string // where it serves, once it said so
}

// startRelay starts outboxctl with args and env, and waits until it says where it serves.
func startRelay(t *testing.T, env []string, args ...string) *relayProcess {
	t.Helper()
	p := &relayProcess{cmd: exec.Command(os.Args[0], args...), exited: make(chan error, 1)}
	p.cmd.Env = append(append(os.Environ(), "OUTBOXCTL_TEST_MAIN=1"), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if !p.waited {
			_ = p.cmd.Process.Kill()
			t.Logf("killed after the test failed: %v", <-p.exited)
		}
	})
	addr := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)`)
	if !testenv.Within(20*time.Second, func() bool {
		if m := addr.FindStringSubmatch(p.stdout.String()); m != nil {
			p.base = m[1]
		}
		return p.base != ""
	}) {
		t.Fatalf("the relay did not say where it serves: %q %q", p.stdout.String(), p.stderr.String())
	}
	return p
}

// outboxctl relay as a process: it relays every outbox of its catalog, exports the fleet on
// /metrics, is ready once live in the fleet, and on SIGTERM releases its leases and exits 0.
func TestRelayUntilSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordURL, fc := openFleet(t)
	acme, globex := tenantDB(t, dir, "acme", 3), tenantDB(t, dir, "globex", 2)
	tenants := filepath.Join(dir, "tenants.txt")
	if err := os.WriteFile(tenants, []byte("# name url [schema] [relay]\nacme "+acme+"\n\nglobex "+globex+" outboxkit poll\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	p := startRelay(t, nil, "relay", "--fleet", "shop", "--coordination", coordURL, "--broker", "memory://",
		"--tenants", tenants, "--addr", "127.0.0.1:0", "--lease-ttl", "2s", "--member", "relay-1")
	cmd, stdout, stderr, exited, base := p.cmd, &p.stdout, &p.stderr, p.exited, p.base
	if !testenv.Within(30*time.Second, func() bool { return pending(t, acme) == 0 && pending(t, globex) == 0 }) {
		t.Fatalf("events still pending: acme %d, globex %d\n%s", pending(t, acme), pending(t, globex), stderr.String())
	}
	if code, body := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if !testenv.Within(10*time.Second, func() bool { code, _ := get(t, base+"/readyz"); return code == 200 }) {
		_, body := get(t, base+"/readyz")
		t.Errorf("/readyz never 200: %s", body)
	}
	var metrics string
	if !testenv.Within(10*time.Second, func() bool {
		_, metrics = get(t, base+"/metrics")
		return strings.Contains(metrics, `outboxkit_fleet_outbox_owned{fleet="shop",outbox="acme",owner="relay-1",tenant="acme"} 1`) &&
			strings.Contains(metrics, `outboxkit_fleet_outbox_owned{fleet="shop",outbox="globex",owner="relay-1",tenant="globex"} 1`)
	}) {
		t.Fatalf("/metrics does not show relay-1 owning both outboxes:\n%s", metrics)
	}
	for _, want := range []string{
		`outboxkit_forwarder_published_total{forwarder="acme",schema=`,
		`outboxkit_fleet_member_leases_acquired_total 2`,
		`outboxkit_fleet_members{fleet="shop"} 1`,
		`outboxkit_fleet_coordination_up{fleet="shop"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, out, errOut := ctl(t, "--db", coordURL, "fleet", "status", "--fleet", "shop", "--check"); code != 0 {
		t.Errorf("fleet status --check while relay-1 runs: exit %d\n%s%s", code, out, errOut)
	}
	if held := leasesHeld(t, fc, "shop"); len(held) != 2 {
		t.Fatalf("leases held while running: %v", held)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		p.waited = true
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not exit within 20s of SIGTERM")
	}
	if held := leasesHeld(t, fc, "shop"); len(held) != 0 {
		t.Errorf("leases still held after SIGTERM: %v", held)
	}
	if !strings.Contains(stdout.String(), "member relay-1 left fleet shop, its leases released") {
		t.Errorf("no word of leaving: %q", stdout.String())
	}
}

// The catalog from a table: the relay reads it, relays what it names, and stops with its context.
func TestRelayTenantsFromATable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordURL, fc := openFleet(t)
	acme := tenantDB(t, dir, "acme", 2)
	catalogURL := migratedSQLite(t)
	cat, err := store.Open(context.Background(), catalogURL, store.OpenOptions{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	if _, err := cat.SQL.Exec(`CREATE TABLE tenants (id TEXT, db_url TEXT, active INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := cat.SQL.Exec(`INSERT INTO tenants VALUES ('acme', ?, 1), ('gone', 'sqlite:///nowhere.db', 0)`, acme); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errOut syncBuffer
	go func() {
		done <- run(ctx, []string{"relay", "--fleet", "shop", "--coordination", coordURL, "--broker", "memory://",
			"--tenants-db", catalogURL, "--tenants-query", "SELECT id AS name, db_url AS url, active AS enabled FROM tenants"}, &out, &errOut)
	}()
	if !testenv.Within(30*time.Second, func() bool { return pending(t, acme) == 0 }) {
		cancel()
		<-done
		t.Fatalf("acme's events still pending\n%s%s", out.String(), errOut.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not stop within 20s of its context")
	}
	if held := leasesHeld(t, fc, "shop"); len(held) != 0 {
		t.Errorf("leases still held after the relay stopped: %v", held)
	}
}

// A relay that could not work is refused at start, saying what to pass.
func TestRelayMistakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordURL, _ := openFleet(t)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.txt", "acme sqlite://"+filepath.Join(dir, "acme.db")+"\n")
	base := []string{"relay", "--fleet", "shop", "--coordination", coordURL, "--broker", "memory://"}
	notMigrated := "sqlite://" + filepath.Join(dir, "empty.db")
	empty, err := store.Open(context.Background(), notMigrated, store.OpenOptions{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = empty.Close()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"relay", "--coordination", coordURL, "--broker", "memory://", "--tenants", good}, 2, "pass --fleet NAME"},
		{[]string{"relay", "--fleet", "shop", "--broker", "memory://", "--tenants", good}, 2, "pass --coordination URL"},
		{[]string{"relay", "--fleet", "shop", "--coordination", coordURL, "--tenants", good}, 2, "pass --broker URL"},
		{base, 2, "one of --tenants FILE or --tenants-db"},
		{append(base, "--tenants", good, "--tenants-db", coordURL, "--tenants-query", "SELECT 1"), 2, "one of --tenants FILE or --tenants-db"},
		{append(base, "--tenants-db", coordURL), 2, "--tenants-db and --tenants-query go together"},
		{append(base, "--tenants", good, "--lease-ttl", "0s"), 2, "--lease-ttl must be a positive"},
		{append(base, "--tenants", write("bad.txt", "acme\n")), 2, "line 1: want \"name url [schema] [relay]\""},
		{append(base, "--tenants", write("bad.json", `[{"name":"acme","uri":"x"}]`)), 2, `unknown field "uri"`},
		{append(base, "--tenants", write("dup.json", `[{"name":"a","url":"sqlite:///a.db"},{"name":"a","url":"sqlite:///b.db"}]`)), 2, "more than once"},
		{append(base, "--tenants", write("log.txt", "acme mysql://db/x outboxkit log\n")), 2, "is a mysql:// URL"},
		{append(base, "--tenants", filepath.Join(dir, "missing.txt")), 2, "no such file"},
		{[]string{"relay", "--fleet", "shop", "--coordination", "sqlite://" + filepath.Join(dir, "typo.db"), "--broker", "memory://", "--tenants", good},
			1, "the file must exist"},
		{append(base[:len(base)-1], "nowhere://", "--tenants", good), 1, "open the broker"},
		{[]string{"relay", "--fleet", "shop", "--coordination", notMigrated, "--broker", "memory://", "--tenants", good}, 1, "outboxctl migrate"},
	} {
		code, _, stderr := ctl(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}
}
