package integration

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// On NATS, messages a consumer was handed must not be lost to it for a long AckWait. A handler
// blocked for longer than AckWait (here 3s, blocked 8s) must not have its messages — the one it
// holds, those prefetched behind it — shed or redelivered behind its back; messages stranded by a
// cut connection must come back soon. Every message is applied exactly once, soon after the fault.
func TestNATS_BlockedOrCutConsumerGetsItsMessagesBackSoon(t *testing.T) {
	const (
		perPhase = 2000
		nKeys    = 10
		soon     = 20 * time.Second // the old 30s AckWait tail does not fit
	)
	for _, fault := range []string{"blocked handler", "cut connection"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			createEffects(t, pgDB(pg))
			url := testenv.NATSURL(t)
			proxy, proxied := testenv.ProxyURL(t, url)
			producer := openBackend(t, url, backends.Options{})
			opts := backends.Options{} // the defaults
			if fault == "blocked handler" {
				opts.AckWait = 3 * time.Second
			}
			consumer := openBackend(t, proxied, opts)
			topic := testenv.UniqueName(t, "nats") + ".placed"
			group := testenv.UniqueName(t, "g")
			dropWhenDone(t, "nats", url, []string{topic}, []string{group})

			var blocked atomic.Bool
			release := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			startEffectConsumer(t, ctx, pgDB(pg), consumer, topic, group, withHook(func(*message.Message) {
				if blocked.Load() {
					<-release
				}
			}))
			storetest.RunForwarder(t, newRelay(t, pgDB(pg), producer.Publisher))

			writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys)
			testenv.Eventually(t, 60*time.Second, "the first phase", func() bool { return countEffects(t, pgDB(pg), group) >= perPhase })

			switch fault {
			case "blocked handler":
				blocked.Store(true)
				writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys)
				<-time.After(8 * time.Second) // the fault, held: the handler sits on one message meanwhile
				blocked.Store(false)
				close(release)
			case "cut connection":
				close(release)
				writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys)
				testenv.Eventually(t, 60*time.Second, "the second phase to be under way", func() bool {
					return countEffects(t, pgDB(pg), group) > perPhase+perPhase/4
				})
				proxy.Cut()
				<-time.After(time.Second) // the fault, held
				proxy.Restore()
			}
			began := time.Now()
			testenv.Eventually(t, 90*time.Second, "every event to be applied", func() bool { return countEffects(t, pgDB(pg), group) >= 2*perPhase })
			took := time.Since(began)
			t.Logf("%s: the rest applied %s after the fault ended", fault, took.Round(100*time.Millisecond))
			if n := countEffects(t, pgDB(pg), group); n != 2*perPhase {
				t.Fatalf("%d effects, want exactly %d", n, 2*perPhase)
			}
			if fault == "blocked handler" {
				if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE deliveries > 1`); n != 0 {
					t.Fatalf("%d messages were redelivered while the handler held them: held messages must be kept alive", n)
				}
			}
			if took > soon {
				t.Fatalf("the last messages came back %s after the fault ended: what a consumer was handed must not wait out a long AckWait", took.Round(time.Second))
			}
		})
	}
}
