package integration

import (
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// However long a broker was away, the relay publishes again within about a second of its return:
// it watches the broker (the publisher's Check every CircuitWatch) instead of waiting out a backoff,
// here set to 30 s so that only the watch can explain a prompt resume. The outage (every connection
// through the test's own proxy cut, new ones refused) lasts 8 s, well past the circuit's opening.
// No row is charged an attempt for it.
func TestCircuit_PublishingResumesWithinASecondOfTheBrokersReturn(t *testing.T) {
	for _, scheme := range []string{"amqp", "nats", "redis", "kafka"} {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			proxy, url := brokerBehindProxy(t, scheme)
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			b := openBackend(t, url, backends.Options{})
			topic := testenv.UniqueName(t, "circuit") + ".placed"
			dropWhenDone(t, scheme, url, []string{topic}, []string{"app"})
			if scheme == "amqp" {
				testenv.DeclareQueue(t, testenv.AMQPURL(t), topic, "app")
			}
			relay := newRelay(t, db, b.Publisher, func(cfg *forwarder.Config) {
				cfg.PublishTimeout = 2 * time.Second
				cfg.CircuitBackoff = forwarder.Backoff{Initial: 30 * time.Second, Max: 30 * time.Second, Multiplier: 1}
			})
			storetest.RunForwarder(t, relay)
			published := func() int {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NOT NULL`)
			}
			writeEvents(t, db, topic, keys(5), 4)
			testenv.Eventually(t, 60*time.Second, "the first events to be published", func() bool { return published() == 20 })

			proxy.Cut()
			cut := time.Now()
			writeEvents(t, db, topic, keys(5), 4) // written during the outage
			testenv.Eventually(t, 30*time.Second, "the relay to open its circuit", func() bool { return relay.Health().CircuitOpen })
			for time.Since(cut) < 8*time.Second {
				if published() != 20 {
					t.Fatal("a row was marked published while every connection to the broker was cut")
				}
				time.Sleep(100 * time.Millisecond) //nolint:forbidigo // the outage lasts 8 s, sampled every 100 ms: nothing is marked published
			}
			proxy.Restore()
			back := time.Now()
			testenv.Eventually(t, 60*time.Second, "the rows written during the outage to be published", func() bool { return published() == 40 })
			resumed := time.Since(back)
			t.Logf("%s: the backlog was published %s after the broker came back (outage %s)", scheme,
				resumed.Round(10*time.Millisecond), back.Sub(cut).Round(100*time.Millisecond))
			// Generous for a loaded machine; the backoff alone would have waited 30 s.
			if resumed > 5*time.Second {
				t.Errorf("the backlog was published %s after the broker came back, want within a few seconds", resumed)
			}
			if n := pg.Int(t, `SELECT coalesce(sum(attempts), 0) FROM {{schema}}.outbox`); n != 0 {
				t.Errorf("%d attempts counted: an outage must not burn attempts", n)
			}
		})
	}
}
