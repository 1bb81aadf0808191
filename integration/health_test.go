package integration

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// A relay started while its broker is down tells a readiness probe at once, not after a whole
// PublishTimeout: either its circuit is open with the reason in Blocked, or the pass that waits
// on the broker shows in PassRunningSince. (On NATS the publish failed only when the message's
// deadline ended: the relay looked closed-circuit and pass-less for 10 s.)
func TestRelayHealth_BrokerDownAtStartShowsAtOnce(t *testing.T) {
	for _, c := range []struct {
		scheme string
		proxy  func(t *testing.T) (*testenv.Proxy, string)
		// circuit: the publish fails at once (the client knows it is not connected), so the
		// circuit itself must be open; otherwise a pass waiting on the broker may show instead.
		circuit bool
	}{
		{"nats", func(t *testing.T) (*testenv.Proxy, string) { return testenv.ProxyURL(t, testenv.NATSURL(t)) }, true},
		{"kafka", kafkaBehindProxy, false},
	} {
		t.Run(c.scheme, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			proxy, url := c.proxy(t)
			topic := testenv.UniqueName(t, "health")
			dropWhenDone(t, c.scheme, url, []string{topic}, nil)
			writeEvents(t, db, topic, keys(3), 2)
			proxy.Cut()
			b := openBackend(t, url, backends.Options{})
			relay := newRelay(t, db, b.Publisher, func(cfg *forwarder.Config) { cfg.PublishTimeout = 30 * time.Second })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})

			// Generous for a loaded machine, and still well short of the 30 s PublishTimeout.
			testenv.Eventually(t, 10*time.Second, "the relay's health to show the broker down or a pass waiting on it", func() bool {
				h := relay.Health()
				return (h.CircuitOpen && outboxkit.IsUnreachable(h.Blocked)) || (!c.circuit && !h.PassRunningSince.IsZero())
			})
			proxy.Restore()
			testenv.Eventually(t, 90*time.Second, "the relay to publish once the broker is back", func() bool {
				h := relay.Health()
				return !h.LastPublish.IsZero() && h.Blocked == nil && !h.CircuitOpen
			})
		})
	}
}
