package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// The consumers' database goes away for 10 s mid-stream (a restart, a failover): every session is
// cut and new ones are refused, while the relay, on a database connection of its own, keeps
// publishing. Nothing may be dead-lettered for it, every effect must happen exactly once once the
// database is back, and the consumer must wait for it with backoff instead of knocking thousands
// of times a second (a broker that redelivers a nacked message at once turns every nack into a
// new attempt).
func TestConsumer_DatabaseOutageBacksOffAndLosesNothing(t *testing.T) {
	const outage = 10 * time.Second
	for _, c := range []struct {
		scheme string
		url    func(testing.TB) string
		opts   backends.Options
	}{
		{"amqp", testenv.AMQPURL, backends.Options{}},
		{"redis", testenv.RedisURL, backends.Options{}},
	} {
		t.Run(c.scheme, func(t *testing.T) {
			t.Parallel()
			const perPhase, nKeys = 200, 10
			pg := testenv.NewPG(t)
			createEffects(t, pgDB(pg))
			proxy, proxied := testenv.ProxyURL(t, pg.URL)
			pool, err := pgxpool.New(context.Background(), proxied)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)

			url := c.url(t)
			b := openBackend(t, url, c.opts)
			topic := testenv.UniqueName(t, "outage") + ".placed"
			dropWhenDone(t, c.scheme, url, []string{topic}, []string{"app"})
			if c.scheme == "amqp" {
				testenv.DeclareQueue(t, url, topic, "app")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			startEffectConsumer(t, ctx, pgDB(pg), b, topic, "app", withStack(func(cfg *middleware.StackConfig) { cfg.Store = pg.StoreOn(t, pool) }))
			storetest.RunForwarder(t, newRelay(t, pgDB(pg), b.Publisher))

			writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys)
			testenv.Eventually(t, 60*time.Second, "the first events to be applied", func() bool { return countEffects(t, pgDB(pg), "app") >= perPhase/2 })

			proxy.Cut()
			before := proxy.Attempts()
			writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys) // relayed while the consumer cannot reach its database
			<-time.After(outage)                                         // the outage itself: a fault held for its duration, not a wait for a condition
			attempts := proxy.Attempts() - before
			proxy.Restore()

			testenv.Eventually(t, 90*time.Second, "every event to be applied after the outage", func() bool {
				return countEffects(t, pgDB(pg), "app") >= 2*perPhase
			})
			if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`); n != 0 {
				t.Fatalf("%d messages were dead-lettered because the database was unreachable; an outage must only delay", n)
			}
			if n := countEffects(t, pgDB(pg), "app"); n != 2*perPhase {
				t.Fatalf("%d effects, want exactly %d", n, 2*perPhase)
			}
			max := pg.Int(t, `SELECT coalesce(max(deliveries), 0) FROM {{schema}}.inbox_deliveries`)
			t.Logf("%s: %d connection attempts to the database during a %s outage (%.1f/s); highest delivery count %d",
				c.scheme, attempts, outage, float64(attempts)/outage.Seconds(), max)
			if attempts > 60 {
				t.Fatalf("%d connection attempts in %s: the consumer must back off while its database is unreachable", attempts, outage)
			}
			if max > 2 {
				t.Fatalf("a message was counted %d deliveries: the outage must not burn the delivery budget", max)
			}
		})
	}
}
