package integration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// saramaMember is a consumer group member as earlier versions made it: Sarama, range protocol.
type saramaMember struct{ got *atomic.Int64 }

func (saramaMember) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (saramaMember) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (m saramaMember) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for cm := range claim.Messages() {
		m.got.Add(1)
		sess.MarkMessage(cm, "")
	}
	return nil
}

// A rolling upgrade: a member of an earlier version (Sarama, which offers only the range protocol)
// is still in the group when a member of this one joins. The new member must be let in and get
// partitions, rather than being refused for want of a protocol in common until the old one is gone.
func TestKafka_NewMemberJoinsAGroupOfSaramaMembers(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	topic := testenv.UniqueName(t, "upgrade")
	group := testenv.UniqueName(t, "g")
	createKafkaTopic(t, url, topic, 2)
	producer := openBackend(t, url, backends.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	publishing := publishSteadily(ctx, producer.Publisher, topic, 20, 10*time.Millisecond)
	defer func() { cancel(); <-publishing }()

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	old, err := sarama.NewConsumerGroup([]string{strings.TrimPrefix(url, "kafka://")}, group, cfg)
	if err != nil {
		t.Fatal(err)
	}
	oldGot := &atomic.Int64{}
	oldDone := make(chan struct{})
	go func() {
		defer close(oldDone)
		for ctx.Err() == nil {
			if err := old.Consume(ctx, []string{topic}, saramaMember{oldGot}); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				t.Logf("old member: %v", err)
			}
		}
	}()
	defer func() { cancel(); _ = old.Close(); <-oldDone }()
	testenv.Eventually(t, 60*time.Second, "the old member to consume", func() bool { return oldGot.Load() > 20 })

	log := watermill.NewCaptureLogger()
	sub, err := openBackend(t, url, backends.Options{Logger: log}).NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	newGot := &atomic.Int64{}
	newDone := make(chan struct{})
	go func() {
		defer close(newDone)
		for m := range msgs {
			newGot.Add(1)
			m.Ack()
		}
	}()
	defer func() { cancel(); _ = sub.Close(); <-newDone }()
	testenv.Eventually(t, 60*time.Second, "the new member to be let into the group and get messages", func() bool {
		return len(owned(log, -1)) == 1 && newGot.Load() > 20
	})
	fromOld := oldGot.Load()
	testenv.Eventually(t, 30*time.Second, "the old member to go on with the other partition", func() bool { return oldGot.Load() > fromOld+20 })
}
