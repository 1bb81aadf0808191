package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

func migratedSQLite(t *testing.T) string {
	t.Helper()
	url := "sqlite://" + filepath.Join(t.TempDir(), "ctl.db")
	if code, _, stderr := ctl(t, "--db", url, "migrate"); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	return url
}

func TestConsoleRefusesTheNetworkWithoutCredentials(t *testing.T) {
	url := migratedSQLite(t)
	t.Setenv("OUTBOXKIT_CONSOLE_TOKENS", "")
	code, _, stderr := ctl(t, "--db", url, "console", "--addr", "0.0.0.0:0")
	if code != 2 || !strings.Contains(stderr, "refusing to listen beyond this machine without authentication") {
		t.Fatalf("exit %d, %q", code, stderr)
	}
	t.Setenv("OUTBOXKIT_CONSOLE_TOKENS", "alice:operator:short")
	if code, _, stderr := ctl(t, "--db", url, "console"); code != 2 || !strings.Contains(stderr, "shorter than") {
		t.Fatalf("a short token: exit %d, %q", code, stderr)
	}
}

// syncBuffer is stdout written by the console's goroutine and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Without tokens the console serves the person at this machine, under its prefix, and stops
// when its context ends.
func TestConsoleServesThisMachine(t *testing.T) {
	url := migratedSQLite(t)
	t.Setenv("OUTBOXKIT_CONSOLE_TOKENS", "")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--db", url, "console", "--addr", "127.0.0.1:0", "--prefix", "/console"}, &out, io.Discard)
	}()
	addr := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/console)/`)
	var base string
	if !testenv.Within(10*time.Second, func() bool {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
		return base != ""
	}) {
		t.Fatalf("the console did not say where it listens: %q", out.String())
	}
	if !strings.Contains(out.String(), "from this machine only") {
		t.Errorf("the banner does not say who may sign in: %q", out.String())
	}
	for path, want := range map[string]string{"/healthz": "ok", "/": "All clear"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, no %q in %.200s", path, resp.StatusCode, want, body)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the console did not stop within 15s of its context")
	}
	_ = store.SideOutbox
}

// With --fleet, the console serves the fleet's page from the coordination database (--db) and
// each tenant's console from the catalog (--tenants, read as outboxctl relay reads it).
func TestConsoleServesAFleet(t *testing.T) {
	coordURL, fc := openFleet(t)
	acme, globex := migratedSQLite(t), migratedSQLite(t)
	tenants := filepath.Join(t.TempDir(), "tenants.txt")
	if err := os.WriteFile(tenants, []byte("# the shop's tenants\nacme "+acme+"\nglobex "+globex+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx0 := context.Background()
	if _, err := fc.FleetHeartbeat(ctx0, "shop", store.FleetMember{Name: "relay-a", Host: "host-a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := fc.AcquireLease(ctx0, "shop", "acme", "relay-a", time.Hour); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	t.Setenv("OUTBOXKIT_CONSOLE_TOKENS", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", coordURL, "console", "--tenants", tenants}, "go with --fleet NAME"},
		{[]string{"--db", coordURL, "console", "--fleet", "shop"}, "--fleet needs the fleet's catalog"},
		{[]string{"--db", coordURL, "console", "--fleet", "shop", "--tenants", tenants, "--tenants-db", acme, "--tenants-query", "SELECT 1"},
			"--fleet needs the fleet's catalog"},
		{[]string{"--db", coordURL, "console", "--fleet", "shop", "--tenants-db", acme}, "go together"},
	} {
		if code, _, stderr := ctl(t, c.args...); code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %q, want %q", c.args[2:], code, stderr, c.want)
		}
	}

	ctx, cancel := context.WithCancel(ctx0)
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--db", coordURL, "console", "--fleet", "shop", "--tenants", tenants, "--addr", "127.0.0.1:0"}, &out, io.Discard)
	}()
	addr := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)/`)
	var base string
	if !testenv.Within(10*time.Second, func() bool {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
		return base != ""
	}) {
		t.Fatalf("the console did not say where it listens: %q", out.String())
	}
	if !strings.Contains(out.String(), "for fleet shop (coordination database sqlite") {
		t.Errorf("the banner does not name the fleet: %q", out.String())
	}
	for path, want := range map[string]string{"/": `data-outbox="globex"`, "/t/acme/": "All clear", "/t/globex/letters": "Dead letters", "/healthz": "ok"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, no %q in %.300s", path, resp.StatusCode, want, body)
		}
	}
	resp, err := http.Get(base + "/t/initech/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown tenant: %d", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the console did not stop within 15s of its context")
	}
}
