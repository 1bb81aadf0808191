package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
)

// On every backend that can say: five messages published for a group that has not consumed them
// wait in the broker (with the age of the oldest, where the broker tells); once the group has
// consumed and acknowledged them, nothing waits. The gauges read the same at scrape time. A
// backend that cannot say returns ErrLagUnknown and exports nothing.
func TestLag_TheBrokerBacklogOfAConsumerGroup(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.scheme, func(t *testing.T) {
			t.Parallel()
			url := bc.url(t)
			b := openBackend(t, url, bc.opts)
			topic := testenv.UniqueName(t, "lag") + ".placed"
			dropWhenDone(t, bc.scheme, url, []string{topic}, []string{"billing"})
			sub, err := b.NewSubscriber("billing")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Close() })
			ctx := context.Background()
			if _, err := b.Lag(ctx, topic, "billing"); bc.scheme == "memory" {
				if !errors.Is(err, backends.ErrLagUnknown) {
					t.Fatalf("%s: Lag = %v, want ErrLagUnknown", bc.scheme, err)
				}
				return
			}
			if err := sub.SubscribeInitialize(topic); err != nil {
				t.Fatal(err)
			}
			var msgs []*message.Message
			for i := range 5 {
				msgs = append(msgs, pipeline.NewEvent("OrderPlaced", fmt.Sprintf("order-%d", i), []byte(`{}`)))
			}
			if err := b.Publisher.Publish(topic, msgs...); err != nil {
				t.Fatal(err)
			}
			var l backends.Lag
			testenv.Eventually(t, 30*time.Second, "five messages waiting for the group", func() bool {
				l, err = b.Lag(ctx, topic, "billing")
				return err == nil && l.Waiting == 5
			})
			if l.HasUnacked && l.Unacked != 0 {
				t.Fatalf("%d unacked before anyone consumed", l.Unacked)
			}
			wantAge := bc.scheme != "amqp" // AMQP 0-9-1 does not tell a message's age
			if l.HasAge != wantAge || (l.HasAge && (l.OldestAge < 0 || l.OldestAge > time.Minute)) {
				t.Fatalf("oldest age %v (known %v), want known=%v and within a minute", l.OldestAge, l.HasAge, wantAge)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(prom.NewLagCollector(b, topic, "billing"))
			if v := metricValue(t, reg, "outboxkit_consumer_broker_waiting", map[string]string{"consumer": "billing", "topic": topic}); v != 5 {
				t.Fatalf("outboxkit_consumer_broker_waiting = %v, want 5", v)
			}

			// The group consumes and acknowledges everything: nothing waits.
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ch, err := sub.Subscribe(cctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			for i := range msgs {
				select {
				case m := <-ch:
					if i == 0 && l.HasUnacked {
						// Handed out and not acknowledged yet: unacked, no longer waiting.
						testenv.Eventually(t, 30*time.Second, "the held messages counted as unacked", func() bool {
							l, err = b.Lag(ctx, topic, "billing")
							return err == nil && l.Unacked >= 1 && l.Waiting+l.Unacked == 5
						})
					}
					m.Ack()
				case <-time.After(30 * time.Second):
					t.Fatal("the group was not handed its messages")
				}
			}
			testenv.Eventually(t, 30*time.Second, "nothing waiting once the group acknowledged everything", func() bool {
				l, err = b.Lag(ctx, topic, "billing")
				return err == nil && l.Waiting == 0 && (!l.HasUnacked || l.Unacked == 0)
			})
		})
	}
}
