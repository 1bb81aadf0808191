package integration

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// Kafka with static membership (Options.KafkaInstanceID): a member of a group that restarts gets
// its partitions back without a rebalance, so the other member keeps its own and never stops.
func TestKafka_StaticMemberRestartDoesNotStopTheGroup(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	topic := testenv.UniqueName(t, "static")
	group := testenv.UniqueName(t, "g")
	createKafkaTopic(t, url, topic, 2)
	producer := openBackend(t, url, backends.Options{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	publishing := publishSteadily(ctx, producer.Publisher, topic, 20, 10*time.Millisecond) // over both partitions
	defer func() { cancel(); <-publishing }()

	member := func(name string, logger watermill.LoggerAdapter) (stop func(), got *atomic.Int64) {
		b := openBackend(t, url, backends.Options{KafkaInstanceID: name, Logger: logger})
		sub, err := b.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		mctx, mcancel := context.WithCancel(ctx)
		msgs, err := sub.Subscribe(mctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		got = &atomic.Int64{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for m := range msgs {
				got.Add(1)
				m.Ack()
			}
		}()
		return func() { mcancel(); _ = sub.Close(); <-done }, got
	}
	stay := watermill.NewCaptureLogger()
	nameA := testenv.UniqueName(t, "a")
	stopA, gotA := member(nameA, nil)
	stopB, gotB := member(testenv.UniqueName(t, "b"), stay)
	defer stopB()
	testenv.Eventually(t, 60*time.Second, "both members to get messages", func() bool { return gotA.Load() > 20 && gotB.Load() > 20 })
	before := assignments(stay)

	// A restarts: the same instance id, a new process.
	stopA()
	stopA2, gotA2 := member(nameA, nil)
	defer stopA2()
	testenv.Eventually(t, 30*time.Second, "the restarted member to get its partition back", func() bool { return gotA2.Load() > 20 })
	fromB := gotB.Load()
	testenv.Eventually(t, 30*time.Second, "the other member to go on", func() bool { return gotB.Load() > fromB+20 })
	// Two of B's heartbeats (2s each) later, a rebalance would have reached it.
	<-time.After(5 * time.Second)
	if after := assignments(stay); after != before {
		t.Fatalf("the other member was assigned partitions %d times during the restart: the group rebalanced", after-before)
	}
}

// assignments counts the partition assignments a member logged.
func assignments(l *watermill.CaptureLoggerAdapter) int {
	n := 0
	for _, m := range l.Captured()[watermill.InfoLogLevel] {
		if m.Msg == "Kafka partitions assigned" {
			n++
		}
	}
	return n
}
