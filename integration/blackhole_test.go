package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/redisbackend"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// A black hole — the broker's address accepts connections and never answers, as a network path
// that drops packets does — lasting 6 s while the relay publishes: the connections the backend's
// clients open meanwhile, and hold after, stay within a bound of their pools, instead of a new
// connection for every timed-out command. A consumer reads the topic through the same proxy. Then
// everything is published and consumed, with no attempt burned.
func TestBlackHole_ConnectionsStayBounded(t *testing.T) {
	cases := []struct {
		name, scheme string
		// most connections the client may open during the black hole, and hold after it
		opened, held int
	}{
		// Held: the relay's pool (redisbackend.DefaultPoolSize) and the consumer's few. Opened:
		// each client replaces what times out in the black hole (go-redis's 3 s read timeout), and
		// no client past its pool's cap — the relay's and the consumer subscription's, whose
		// blocking read and liveness renewals time out too (10 to 16 opened seen on 2 CPUs,
		// depending on when the timeouts fall). go-redis's defaults held 22 and opened 21 more on
		// 2 CPUs (10 a CPU), where the pool was not capped.
		{"redis", "redis", 2 * redisbackend.DefaultPoolSize, redisbackend.DefaultPoolSize + 5},
		// One connection each for the relay and the consumer.
		{"amqp", "amqp", 2, 2},
		{"nats", "nats", 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			proxy, url := brokerBehindProxy(t, c.scheme)
			pg := testenv.NewPG(t)
			db := pgDB(pg)
			b := openBackend(t, url, backends.Options{})
			topic := testenv.UniqueName(t, "blackhole") + ".placed"
			dropWhenDone(t, c.scheme, url, []string{topic}, []string{"app"})
			if c.scheme == "amqp" {
				testenv.DeclareQueue(t, testenv.AMQPURL(t), topic, "app")
			}
			createEffects(t, db)
			consumeCtx, stopConsumer := context.WithCancel(context.Background())
			defer stopConsumer()
			startEffectConsumer(t, consumeCtx, db, b, topic, "app")
			relay := newRelay(t, db, b.Publisher)
			storetest.RunForwarder(t, relay)

			// Orders keep coming, 500 a second over 50 keys, before, during and after the black
			// hole: enough to keep every connection of the relay's pool busy.
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var mu sync.Mutex
			written := 0
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for ctx.Err() == nil {
					writeEvents(t, db, topic, keys(50), 1)
					mu.Lock()
					written += 50
					mu.Unlock()
					select {
					case <-ctx.Done():
					case <-tick.C:
					}
				}
			}()
			published := func() int {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NOT NULL`)
			}
			testenv.Eventually(t, 60*time.Second, "the relay to publish", func() bool { return published() >= 1000 })
			before, heldBefore := proxy.Attempts(), proxy.Open()

			proxy.Freeze()
			time.Sleep(6 * time.Second) //nolint:forbidigo // the fault: the black hole lasts 6 s
			opened, heldIn := proxy.Attempts()-before, proxy.Open()
			proxy.Thaw()
			time.Sleep(2 * time.Second) //nolint:forbidigo // 2 s more of orders, written after the black hole
			stop()
			wg.Wait()
			mu.Lock()
			total := written
			mu.Unlock()
			testenv.Eventually(t, 60*time.Second, "every order to be published after the black hole", func() bool { return published() == total })
			testenv.Eventually(t, 120*time.Second, "every order to be consumed", func() bool { return countEffects(t, db, "app") == total })
			heldAfter := proxy.Open()
			// At its end the proxy still counts the connections the client closed in the black
			// hole: it notices a close when it forwards again.
			t.Logf("%s: %d connections open before the black hole, %d through the proxy at its end; %d opened during it; %d open once drained",
				c.name, heldBefore, heldIn, opened, heldAfter)
			if opened > int64(c.opened) {
				t.Errorf("the relay's client opened %d connections during a 6 s black hole, want at most %d", opened, c.opened)
			}
			if heldAfter > c.held {
				t.Errorf("the relay's client holds %d connections after the black hole, want at most %d", heldAfter, c.held)
			}
			if n := pg.Int(t, `SELECT coalesce(sum(attempts), 0) FROM {{schema}}.outbox`); n != 0 {
				t.Errorf("%d attempts counted: a black hole must not burn attempts", n)
			}
		})
	}
}
