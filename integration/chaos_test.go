package integration

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/outboxkit/outboxkit/internal/testenv"
)

// runChaos runs internal/cmd/chaos against the test's Postgres and RabbitMQ (it makes a schema and a vhost of
// its own, and removes them) and returns its output and exit code.
func runChaos(t *testing.T, args ...string) (string, int) {
	t.Helper()
	testenv.Rabbitmqctl(t) // it gives itself a vhost and closes its connections with it
	pgURL, amqpURL := testenv.PostgresURL(t), testenv.AMQPURL(t)
	demo, _ := binaries(t)
	chaos := filepath.Join(filepath.Dir(demo), "chaos")
	all := append([]string{"--store", "postgres", "--broker", "amqp", "--db", pgURL, "--broker-url", amqpURL,
		"--demo", demo, "--repo", "..", "--quiet"}, args...)
	var out bytes.Buffer
	cmd := exec.Command(chaos, all...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run internal/cmd/chaos: %v", err)
	}
	return out.String(), code
}

// The soak's short run: the demo's order service, two forwarders and the three consumers as
// processes of their own on Postgres and RabbitMQ, orders at a steady rate with repeated and
// retried POSTs, and every fault at random — SIGKILLs and restarts, the soak's RabbitMQ connections
// closed, its Postgres sessions terminated, poisoned events, relays dying between publish and mark,
// Billing dying between its charge and its commit. Then the checker: nothing lost, nothing doubled.
func TestChaos_ShortSoakHoldsEveryInvariant(t *testing.T) {
	out, code := runChaos(t, "--duration", "2m", "--drain", "3m", "--rate", "15")
	t.Log("\n" + out)
	if code != 0 || !regexp.MustCompile(`(?m)^RESULT: every invariant held$`).MatchString(out) {
		t.Fatalf("the soak failed (exit %d)", code)
	}
	// Every kind of fault was injected at least once: a soak that provoked nothing proves nothing.
	for _, fault := range []string{"SIGKILL a forwarder", "SIGKILL a consumer process", "SIGKILL the order service",
		"close the soak's broker connections", "terminate the soak's database sessions",
		"forwarder pass dies after publish", "Billing dies after its charge", "poisoned event", "POST repeated"} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(fault) + `.*?\s{2,}(\d+)\s`).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("no line for fault %q in the failure matrix", fault)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n == 0 {
			t.Errorf("fault %q was never injected", fault)
		}
	}
}

// The negative control: the same soak with consumers that have no inbox must fail, and say why —
// events applied twice.
func TestChaos_WithoutTheInboxTheCheckerFails(t *testing.T) {
	out, code := runChaos(t, "--duration", "30s", "--drain", "90s", "--rate", "15", "--no-inbox")
	t.Log("\n" + out)
	if code != 1 {
		t.Fatalf("the soak without the inbox exited %d, want 1 (a violation)", code)
	}
	m := regexp.MustCompile(`effects missed \d+, doubled (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no effects line in the output")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("without the inbox no effect was doubled: the soak cannot tell an inbox from none")
	}
}

// The soak's short run with the log relay (forwarder/pglog) in place of the polling one, on the
// private logical cluster: two relay processes share one slot (one reads, one stands by), each
// killed at random and each exiting at every 5th flush, after publishing, before confirming (a
// relay that made progress only between crashes counted in messages would livelock once its
// backlog outgrew the count); the checker holds as is, with no outbox row left behind.
func TestChaos_LogRelayHoldsEveryInvariant(t *testing.T) {
	out, code := runChaos(t, "--relay", "log", "--db", testenv.PGLogicalURL(t),
		"--duration", "30s", "--drain", "90s", "--rate", "15", "--crash-after-publish", "5")
	logRelaySoakHeld(t, out, code, "log relay (table mode)")
}

// The same short run with the binlog relay (forwarder/mysqlbinlog) on the private MariaDB with the
// binary log on: the two relay processes are one relay group, one reading the binary log while the
// other waits for the group's lock; each is killed at random and exits in its 5th second of
// publishing, after a publish, before the checkpoint that removes the published rows.
func TestChaos_BinlogRelayHoldsEveryInvariant(t *testing.T) {
	out, code := runChaos(t, "--store", "mysql", "--relay", "log", "--db", testenv.MySQLBinlogURL(t),
		"--duration", "30s", "--drain", "90s", "--rate", "15", "--crash-after-publish", "5")
	logRelaySoakHeld(t, out, code, "binlog relay")
}

// logRelaySoakHeld fails the test unless the soak ran the relay label names, every invariant held
// and a relay process exited after publishing at least once.
func logRelaySoakHeld(t *testing.T, out string, code int, label string) {
	t.Helper()
	t.Log("\n" + out)
	if code != 0 || !regexp.MustCompile(`(?m)^RESULT: every invariant held$`).MatchString(out) {
		t.Fatalf("the soak with the %s failed (exit %d)", label, code)
	}
	if !regexp.MustCompile(`(?m)^failure matrix — .*, ` + regexp.QuoteMeta(label) + `, `).MatchString(out) {
		t.Fatalf("the failure matrix does not say the soak ran the %s", label)
	}
	m := regexp.MustCompile(`(?m)^forwarder pass dies after publish.*?\s{2,}(\d+)\s`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no line for the relay's exits after publish in the failure matrix")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("no log relay exited after publishing: the soak never made the standby take over mid-stream")
	}
}
