package pglog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// cluster is a private wal_level = logical cluster that a test may crash and reconfigure, started
// with scripts/pg-logical.sh on a port of its own (the shared logical cluster serves the other tests).
type cluster struct {
	root, bin, data string
	port            int
	url             string
}

// privateCluster starts a cluster on a free port and stops and removes it when t ends. Without
// the Postgres server binaries it skips, except under CI=true or OUTBOXKIT_REQUIRE_SERVICES.
func privateCluster(t *testing.T) *cluster {
	t.Helper()
	bin := os.Getenv("PG_LOGICAL_BIN")
	if bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Strings(dirs)
		if len(dirs) > 0 {
			bin = dirs[len(dirs)-1]
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err != nil {
		msg := fmt.Sprintf("no Postgres server binaries (pg_ctl in %q): install postgresql 15 or newer or set PG_LOGICAL_BIN to run this test", bin)
		if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
			t.Fatal("a missing service is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg)
		}
		t.Skip(msg)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	c := &cluster{root: root, bin: bin, port: port,
		data: filepath.Join(root, ".cache", "pg-logical", fmt.Sprint(port), "data"),
		url:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable&connect_timeout=2", port)}
	t.Cleanup(func() {
		c.script(t, "stop")
		if err := os.RemoveAll(filepath.Dir(c.data)); err != nil {
			t.Errorf("remove the private cluster: %v", err)
		}
	})
	c.script(t, "start")
	return c
}

func (c *cluster) script(t *testing.T, verb string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.root, "scripts", "pg-logical.sh"), verb)
	cmd.Env = append(os.Environ(), fmt.Sprintf("PG_LOGICAL_PORT=%d", c.port), "PG_LOGICAL_BIN="+c.bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/pg-logical.sh %s: %v\n%s", verb, err, out)
	}
}

// crash stops the server as a power cut would: no shutdown checkpoint, connections cut.
func (c *cluster) crash(t *testing.T) {
	t.Helper()
	args := []string{filepath.Join(c.bin, "pg_ctl"), "-D", c.data, "-w", "-m", "immediate", "stop"}
	if os.Getuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl stop -m immediate: %v\n%s", err, out)
	}
}

// tryWrite commits n events of key in one transaction, reporting an error instead of failing.
func tryWrite(pg *testenv.PG, key string, n int) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	ids := make([]string, n)
	msgs := make([]store.OutboxMessage, n)
	for i := range msgs {
		ids[i] = uuid.Must(uuid.NewV7()).String()
		msgs[i] = store.OutboxMessage{UUID: ids[i], Topic: "orders", PartitionKey: key, Payload: []byte(key), Metadata: []byte("{}")}
	}
	if err := pg.Store.UnwrapTx(tx).InsertOutbox(ctx, msgs); err != nil {
		return nil, err
	}
	return ids, tx.Commit(ctx)
}

// invalidate makes the server invalidate slot (wal_status = lost) by writing WAL past
// max_slot_wal_keep_size while nobody reads it.
func invalidate(t *testing.T, pg *testenv.PG, slot string) {
	t.Helper()
	pg.Exec(t, `CREATE TABLE IF NOT EXISTS {{schema}}.busy (id bigint)`)
	status := func() string {
		var s string
		if err := pg.Pool.QueryRow(context.Background(), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := status(); s == "lost" {
		t.Fatalf("slot %s lost before the test invalidated it", slot)
	}
	testenv.Eventually(t, 20*time.Second, "the slot invalidated", func() bool {
		for range 3 {
			pg.Exec(t, `INSERT INTO {{schema}}.busy VALUES (1)`)
			pg.Exec(t, `SELECT pg_switch_wal()`)
		}
		pg.Exec(t, `CHECKPOINT`)
		return status() == "lost"
	})
}

// Faults that need a cluster of their own: a crash of the server, and a slot the server
// invalidates. One cluster serves both, in turn.
func TestPrivateCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := privateCluster(t)
	t.Logf("private cluster on :%d started in %s", c.port, time.Since(start).Round(time.Millisecond))

	// pg_ctl stop -m immediate mid-stream, with writers and the relay running: after the server
	// comes back, every event whose commit succeeded is published (at least once).
	t.Run("ImmediateStopLosesNothing", func(t *testing.T) {
		began := time.Now()
		pg := testenv.NewLogicalPGAt(t, c.url)
		pub := newRecorder()
		r := relayOn(t, pg, pub, func(f *forwarder.Config, _ *pglog.Config) {
			f.BatchSize = 32
			f.CircuitBackoff = forwarder.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		select {
		case <-r.Reading():
		case err := <-done:
			done <- err
			t.Fatalf("relay ended before reading its slot: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("relay did not read its slot within 30s")
		}

		var (
			mu        sync.Mutex
			committed []string
			failed    atomic.Int64 // transactions whose commit failed: their events may or may not arrive
			stopW     = make(chan struct{})
			wg        sync.WaitGroup
		)
		const writers = 4
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 21))
				for {
					select {
					case <-stopW:
						return
					default:
					}
					ids, err := tryWrite(pg, fmt.Sprintf("k%d", rng.IntN(16)), 1+rng.IntN(5))
					if err != nil {
						failed.Add(1)
						time.Sleep(20 * time.Millisecond) //nolint:forbidigo // a writer's pause between commits while the server is down, not a wait for it
						continue
					}
					mu.Lock()
					committed = append(committed, ids...)
					mu.Unlock()
				}
			}()
		}
		defer func() {
			select {
			case <-stopW:
			default:
				close(stopW)
			}
			wg.Wait()
		}()
		ncommitted := func() int { mu.Lock(); defer mu.Unlock(); return len(committed) }
		published := func() int { pub.mu.Lock(); defer pub.mu.Unlock(); return len(pub.order) }

		testenv.Eventually(t, 20*time.Second, "the relay publishing mid-stream", func() bool { return published() >= 300 })
		c.crash(t)
		atCrash, pubAtCrash := ncommitted(), published()
		crashed := time.Now()
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // the fault: the server stays down 300 ms, for writers and relay to meet it
		c.script(t, "start")
		restarted := time.Now()
		testenv.Eventually(t, 20*time.Second, "writers committing again", func() bool { return ncommitted() >= atCrash+300 })
		close(stopW)
		wg.Wait()

		mu.Lock()
		all := append([]string(nil), committed...)
		mu.Unlock()
		if !testenv.Within(30*time.Second, func() bool { return pub.has(all) }) {
			missing := 0
			for _, id := range all {
				if pub.count(id) == 0 {
					missing++
				}
			}
			t.Fatalf("%d of %d committed events not published 30s after the restart", missing, len(all))
		}
		caughtUp := time.Now()
		t.Logf("%d events committed (%d at the crash, %d published then), %d commits failed around the crash; "+
			"%d duplicates; server down %s, caught up %s after the restart; subtest %s",
			len(all), atCrash, pubAtCrash, failed.Load(), pub.duplicates(), restarted.Sub(crashed).Round(time.Millisecond),
			caughtUp.Sub(restarted).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		// A logical slot's confirmed position reaches the disk at checkpoints: after a crash the
		// server reads again from an older one, so events published before the crash may be
		// published again. Only those can be: events committed before it (and at most one
		// transaction per writer whose commit reported an error but went through).
		if d, most := pub.duplicates(), atCrash+writers*5; d > most {
			t.Errorf("%d duplicates, more than the %d events that could have been published before the crash", d, most)
		}
		if failed.Load() == 0 {
			t.Error("no commit failed: the crash did not happen mid-stream")
		}
	})

	// From here on a slot nobody reads is invalidated past 1MB of WAL.
	pool := testenv.NewLogicalPGAt(t, c.url)
	pool.Exec(t, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	pool.Exec(t, `SELECT pg_reload_conf()`)
	testenv.Eventually(t, 10*time.Second, "max_slot_wal_keep_size reloaded", func() bool {
		var v string
		_ = pool.Pool.QueryRow(context.Background(), `SHOW max_slot_wal_keep_size`).Scan(&v)
		return v == "1MB"
	})

	// A slot invalidated by the server (wal_status = lost) is detected at start: table mode
	// drops it and backfills exactly the events committed since its last confirmed position.
	t.Run("InvalidatedSlotBackfillsTheGap", func(t *testing.T) {
		began := time.Now()
		pg := testenv.NewLogicalPGAt(t, c.url)
		pub := newRecorder()
		r := relayOn(t, pg, pub, nil)
		stop := run(t, r)
		first := write(t, pg, "a", 10)
		testenv.Eventually(t, 10*time.Second, "first events", func() bool { return pub.has(first) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 0 {
			t.Fatalf("%d published rows left in the outbox after a clean stop", n)
		}
		var gap []string
		for i := range 5 {
			gap = append(gap, write(t, pg, fmt.Sprintf("k%d", i), 3)...)
		}
		invalidate(t, pg, r.SlotName())

		run(t, relayOn(t, pg, pub, nil))
		after := write(t, pg, "a", 4)
		testenv.Eventually(t, 10*time.Second, "the gap and what follows", func() bool { return pub.has(gap) && pub.has(after) })
		if d := pub.duplicates(); d != 0 {
			t.Errorf("%d duplicates: the backfill read more than the gap", d)
		}
		if s := pg.Int(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND wal_status <> 'lost'`, r.SlotName()); s != 1 {
			t.Errorf("the invalidated slot was not replaced by a live one")
		}
		t.Logf("%d events of the gap backfilled once each; subtest %s", len(gap), time.Since(began).Round(time.Millisecond))
	})

	// In WAL mode an invalidated slot stops the relay with ErrSlotLost, unless SkipLostEvents.
	t.Run("InvalidatedSlotStopsWALMode", func(t *testing.T) {
		began := time.Now()
		pg := testenv.NewLogicalPGAt(t, c.url)
		r := relayOn(t, pg, newRecorder(), walMode)
		if err := run(t, r)(); err != nil {
			t.Fatal(err)
		}
		invalidate(t, pg, r.SlotName())
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := relayOn(t, pg, newRecorder(), walMode).Run(ctx)
		if !errors.Is(err, pglog.ErrSlotLost) || !strings.Contains(err.Error(), `wal_status "lost"`) {
			t.Fatalf("got %v, want ErrSlotLost naming wal_status lost", err)
		}
		pub := newRecorder()
		run(t, relayOn(t, pg, pub, func(f *forwarder.Config, c *pglog.Config) { walMode(f, c); c.SkipLostEvents = true }))
		id, err := transact(walStore(t, pg), "o-1")
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "an event after skipping", func() bool { return pub.has([]string{id}) })
		t.Logf("subtest %s", time.Since(began).Round(time.Millisecond))
	})
	t.Logf("total with the cluster %s", time.Since(start).Round(time.Millisecond))
}
