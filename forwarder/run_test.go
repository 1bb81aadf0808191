package forwarder_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// runForwarder starts Run in the background and stops it when the test ends, checking that it
// returns promptly and cleanly.
func runForwarder(t *testing.T, f *forwarder.Forwarder) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of cancel")
		}
	})
	select {
	case <-f.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("forwarder did not start listening within 10s")
	}
}

func TestRun_NotifyWakesTheRelayLongBeforeThePoll(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, pg, pub, newClock(), func(c *forwarder.Config) {
		c.PollInterval = 10 * time.Second
		c.Now = time.Now
	})
	runForwarder(t, f)

	var latencies []time.Duration
	for i := 0; i < 15; i++ {
		start := time.Now()
		msg := write(t, pg, []string{"k"}, 1)[0]
		select {
		case got := <-pub.notify:
			if got != msg.UUID {
				t.Fatalf("published %s, want %s", got, msg.UUID)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d not published within 5s with a 10s poll: NOTIFY did not wake the relay", i)
		}
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	median := latencies[len(latencies)/2]
	t.Logf("commit-to-publish with NOTIFY (poll 10s): median %s, max %s", median, latencies[len(latencies)-1])
	if median > time.Second {
		t.Fatalf("median %s: NOTIFY is not what woke the relay", median)
	}
}

func TestRun_PollOnly(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, pg, pub, newClock(), func(c *forwarder.Config) {
		c.PollOnly = true
		c.PollInterval = 300 * time.Millisecond
		c.Now = time.Now
	})
	runForwarder(t, f)
	msg := write(t, pg, []string{"k"}, 1)[0]
	select {
	case got := <-pub.notify:
		if got != msg.UUID {
			t.Fatalf("published %s, want %s", got, msg.UUID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("poll-only relay did not publish within 5s with a 300ms poll")
	}
}

func TestRun_RefusesASecondConcurrentRun(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	f := newForwarder(t, pg, newFakePublisher(), newClock(), func(c *forwarder.Config) { c.PollOnly = true })
	runForwarder(t, f)
	if err := f.Run(context.Background()); err == nil {
		t.Fatal("a second Run on the same Forwarder started")
	}
}

// relayWithNamedPool runs a forwarder whose sessions carry a unique application_name, so a test can
// kill exactly them. PollInterval is an hour: only NOTIFY, a reconnect or an error retry wakes it.
func relayWithNamedPool(t *testing.T, pg *testenv.PG, listenRetry time.Duration) (*fakePublisher, string) {
	t.Helper()
	app := testenv.UniqueName(t, "fwd")
	poolCfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pub := newFakePublisher()
	pub.notify = make(chan string, 10)
	f := newForwarder(t, pg, pub, newClock(), func(c *forwarder.Config) {
		c.Pool = pool
		c.PollInterval = time.Hour
		c.ListenRetry = listenRetry
		c.CircuitBackoff = forwarder.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
		c.Now = time.Now
	})
	runForwarder(t, f)
	return pub, app
}

func kill(t *testing.T, pg *testenv.PG, applicationName string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a session named "+applicationName+" to kill", func() bool {
		return pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, applicationName) > 0
	})
	var killed []int32
	rows, err := pg.Pool.Query(context.Background(),
		// The call sits in the select list so it runs only for rows the WHERE clause kept.
		`SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, applicationName)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid int32
		var signalled bool
		_ = rows.Scan(&pid, &signalled)
		killed = append(killed, pid)
	}
	rows.Close()
	// pg_terminate_backend only signals; wait until those sessions are really gone (the relay may
	// already have opened new ones under the same name).
	testenv.Eventually(t, 10*time.Second, "killed sessions to exit", func() bool {
		return pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, killed) == 0
	})
}

func expectPublished(t *testing.T, pub *fakePublisher, uuid string, within time.Duration, why string) {
	t.Helper()
	select {
	case got := <-pub.notify:
		if got != uuid {
			t.Fatalf("published %s, want %s", got, uuid)
		}
	case <-time.After(within):
		t.Fatalf("not published within %s: %s", within, why)
	}
}

// A commit whose NOTIFY is lost while the LISTEN connection is down is still relayed when the
// connection comes back, long before the hour-long poll.
func TestRun_RecoversNotificationsLostWhileListenerWasDown(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pub, app := relayWithNamedPool(t, pg, time.Second)
	kill(t, pg, app+"-listen")
	msg := write(t, pg, []string{"k"}, 1)[0] // its NOTIFY finds nobody listening
	expectPublished(t, pub, msg.UUID, 15*time.Second, "the reconnected listener did not trigger a pass")
}

// Killing the relay's pool sessions makes its next pass fail; Run logs, backs off and carries on.
func TestRun_SurvivesKilledPoolSessions(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pub, app := relayWithNamedPool(t, pg, time.Second)
	kill(t, pg, app)
	msg := write(t, pg, []string{"k"}, 1)[0]
	expectPublished(t, pub, msg.UUID, 15*time.Second, "the relay did not recover from killed sessions")
	msg = write(t, pg, []string{"k"}, 1)[0]
	expectPublished(t, pub, msg.UUID, 15*time.Second, "the relay stopped after recovering")
}
