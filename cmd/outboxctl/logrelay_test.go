package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// status shows the slot of each log relay that ran on the outbox: its mode, whether a relay reads
// it, its WAL status and lag.
func TestStatusShowsTheLogRelaysSlot(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	ctx := context.Background()
	b, err := backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: b.Publisher, Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := pglog.New(pglog.Config{Forwarder: f, Pool: pg.Pool})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, "the slot dropped", func() bool {
			_, err := pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, r.SlotName())
			return err == nil
		})
		pg.Exec(t, `DROP PUBLICATION `+r.SlotName())
	}()
	select {
	case <-r.Reading():
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not start reading")
	}
	code, stdout, stderr := ctl(t, "--db", pg.URL, "--schema", string(pg.Schema), "status")
	if code != 0 {
		t.Fatalf("status: exit %d, %s", code, stderr)
	}
	var line string
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "orders ") {
			line = l
		}
	}
	if !strings.Contains(stdout, "LOG RELAY") || !strings.Contains(line, r.SlotName()) || !strings.Contains(line, "table") ||
		!strings.Contains(line, "attached") || !strings.Contains(line, "reserved") {
		t.Fatalf("status does not show the relay's slot as attached and reserved:\n%s", stdout)
	}
}
