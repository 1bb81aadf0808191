package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Kcat returns the path of kcat (Debian's kafkacat, a librdkafka client), for interoperability
// tests with a Kafka client outboxkit does not control. Missing, the test is skipped — or fails
// under CI=true — saying how to install it (scripts/tools.sh does).
func Kcat(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"kcat", "kafkacat"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	missing(t, "kcat is not installed: run scripts/tools.sh (apt-get install kcat)")
	return ""
}

// NodeAMQP returns the node binary and the path of tools/interop/amqp.js, a RabbitMQ client on the
// stock npm amqplib. Missing, the test is skipped — or fails under CI=true — saying how to install
// it (scripts/tools.sh does).
func NodeAMQP(t testing.TB) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "node is not installed: install Node.js 18 or newer")
		return "", ""
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "tools", "interop")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "amqplib")); err != nil {
		missing(t, "amqplib is not installed in tools/interop: run scripts/tools.sh (npm ci --prefix tools/interop)")
		return "", ""
	}
	return node, filepath.Join(dir, "amqp.js")
}

func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
		t.Fatal("a missing tool is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg)
	}
	t.Skip(msg)
}

// Rabbitmqctl returns the path of rabbitmqctl, which the chaos soak runs on the machine's RabbitMQ
// (a vhost of its own, its connections closed).
func Rabbitmqctl(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		missing(t, "rabbitmqctl is not on PATH: the chaos soak runs it on the machine running RabbitMQ")
	}
	return path
}
