package main

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testenv"
)

// repoRoot is the repository's root, two folders up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// deployBinary builds outboxctl with deploy/Dockerfile's own build line, into a temporary folder.
func deployBinary(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	docker, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var line string
	sc := bufio.NewScanner(strings.NewReader(string(docker)))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "RUN ") && strings.Contains(l, " go build ") {
			line = strings.TrimPrefix(l, "RUN ")
		}
	}
	if line == "" {
		t.Fatal("deploy/Dockerfile has no RUN … go build line")
	}
	out := filepath.Join(t.TempDir(), "outboxctl")
	fields := strings.Fields(strings.Replace(line, "-o /out/outboxctl", "-o "+out, 1))
	var env []string
	for len(fields) > 0 && strings.Contains(fields[0], "=") {
		env, fields = append(env, fields[0]), fields[1:]
	}
	if len(fields) < 2 || fields[0] != "go" {
		t.Fatalf("deploy/Dockerfile's build line %q is not env… go build …", line)
	}
	for i, f := range fields { // -ldflags="-s -w" is one argument to the shell
		fields[i] = strings.ReplaceAll(f, `"`, "")
	}
	args := fields[1:]
	for i := 0; i < len(args)-1; i++ {
		if args[i] == "-ldflags=-s" && args[i+1] == "-w" {
			args = append(args[:i], append([]string{"-ldflags=-s -w"}, args[i+2:]...)...)
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
	return out
}

// The image's binary, built as deploy/Dockerfile builds it, is static — it runs on an empty image —
// and is the relay: it relays an outbox configured by the environment its env file sets, and
// stops on SIGTERM with exit 0. The systemd unit that runs it passes systemd-analyze verify.
func TestDeploy_StaticBinaryRelaysAndTheUnitVerifies(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image and the unit are Linux's")
	}
	t.Parallel()
	bin := deployBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("%s is linked dynamically (%v): it would not run on the image's empty base", bin, p.Type)
		}
	}
	_ = f.Close()

	// The env file's settings are the ones outboxctl reads.
	root := repoRoot(t)
	envFile, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "relay.env"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"OUTBOXKIT_DATABASE_URL": true, "OUTBOXKIT_SCHEMA": true, "OUTBOXKIT_BROKER_URL": true,
		"OUTBOXKIT_RELAY": true, "OUTBOXKIT_RELAY_NAME": true, "OUTBOXKIT_LOG_MODE": true}
	for _, l := range strings.Split(string(envFile), "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if k, _, _ := strings.Cut(l, "="); !known[k] {
			t.Errorf("deploy/systemd/relay.env sets %s, which outboxctl relay does not read", k)
		}
	}

	dir := t.TempDir()
	url := tenantDB(t, dir, "shop", 4)
	cmd := exec.Command(bin, "relay")
	cmd.Env = append(os.Environ(), "OUTBOXKIT_DATABASE_URL="+url, "OUTBOXKIT_BROKER_URL=memory://", "OUTBOXKIT_RELAY_NAME=orders")
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if !testenv.Within(30*time.Second, func() bool { return pending(t, url) == 0 }) {
		_ = cmd.Process.Kill()
		t.Logf("killed: %v", <-exited)
		t.Fatalf("the image's binary relayed nothing: %d pending\n%s%s", pending(t, url), stdout.String(), stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the image's binary did not stop within 20s of SIGTERM")
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		msg := "no systemd-analyze on this machine: the unit is not verified (the binary it runs is)"
		if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
			t.Fatal("a missing tool is a failure here (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg + "; install systemd")
		}
		t.Skip(msg)
	}
	unit, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "outboxkit-relay.service"))
	if err != nil {
		t.Fatal(err)
	}
	// The unit as installed, with this build's binary and env file where the unit expects them.
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/outboxctl", bin)
	text = strings.ReplaceAll(text, "/etc/outboxkit/relay.env", filepath.Join(root, "deploy", "systemd", "relay.env"))
	path := filepath.Join(dir, "outboxkit-relay.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// It exits 0 on a line it could not parse, which it ignores: what it says of the unit fails too.
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "outboxkit-relay.service") {
		t.Fatalf("systemd-analyze verify deploy/systemd/outboxkit-relay.service: %v\n%s", err, out)
	}
}
