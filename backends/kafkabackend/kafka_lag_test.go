package kafkabackend

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// The lag reader sums, over the topic's partitions, the records after the group's committed
// offsets — from the oldest record where the group committed nothing, a group never seen included —
// and reports the age of the oldest of the first records not committed. One reader serves every
// read, concurrent ones too, as the scrapes of several groups do.
func TestKafkaLag_CountsWhatIsNotCommittedOnEveryPartition(t *testing.T) {
	brokers := []string{strings.TrimPrefix(testenv.KafkaURL(t), "kafka://")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := testenv.UniqueName(t, "lag")
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })

	// Partition 0 holds offsets 0–4, partition 1 offsets 0–2, partition 2 nothing; each record is
	// as old as its timestamp says.
	now := time.Now()
	for _, r := range []struct {
		partition int32
		ages      []time.Duration
	}{
		{0, []time.Duration{10 * time.Minute, 9 * time.Minute, 5 * time.Minute, 4 * time.Minute, 3 * time.Minute}},
		{1, []time.Duration{2 * time.Minute, time.Minute, 30 * time.Second}},
	} {
		for _, age := range r.ages {
			rec := &kgo.Record{Topic: topic, Partition: r.partition, Value: []byte("{}"), Timestamp: now.Add(-age)}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	group := topic + "_billing"
	commit := func(at map[int32]int64) {
		t.Helper()
		os := make(kadm.Offsets)
		for p, o := range at {
			os.AddOffset(topic, p, o, -1)
		}
		if err := adm.CommitAllOffsets(ctx, group, os); err != nil {
			t.Fatal(err)
		}
	}

	lag := &kafkaLag{conn: kafkaConn{brokers: brokers}}
	defer func() {
		if err := lag.close(); err != nil {
			t.Error(err)
		}
	}()
	expect := func(what, group string, waiting int64, oldest time.Duration) {
		t.Helper()
		// Read twice at once: the reader is shared by the scrapes of every group.
		var (
			wg   sync.WaitGroup
			got  [2]backends.Lag
			errs [2]error
		)
		for i := range got {
			wg.Go(func() { got[i], errs[i] = lag.read(ctx, topic, group) })
		}
		wg.Wait()
		for i, l := range got {
			if errs[i] != nil {
				t.Fatalf("%s: %v", what, errs[i])
			}
			if l.Waiting != waiting || l.HasUnacked {
				t.Fatalf("%s: %d waiting (unacked known: %v), want %d", what, l.Waiting, l.HasUnacked, waiting)
			}
			// The age is read now, a little after the records were written.
			if wantAge := oldest > 0; l.HasAge != wantAge || (wantAge && (l.OldestAge < oldest || l.OldestAge > oldest+time.Minute)) {
				t.Fatalf("%s: oldest age %v (known: %v), want %v", what, l.OldestAge, l.HasAge, oldest)
			}
		}
	}

	expect("a group never seen", topic+"_nobody", 5+3, 10*time.Minute)
	commit(map[int32]int64{0: 2})
	expect("partition 0 committed up to offset 2, the others not at all", group, 3+3, 5*time.Minute)
	commit(map[int32]int64{0: 4})
	expect("partition 0 committed up to offset 4", group, 1+3, 3*time.Minute)
	commit(map[int32]int64{0: 5, 1: 3})
	expect("everything committed", group, 0, 0)
}

// A topic that does not exist is an error that names it, and reading its lag does not create it:
// a scrape only reads.
func TestKafkaLag_TopicThatDoesNotExistIsAnErrorAndIsNotCreated(t *testing.T) {
	brokers := []string{strings.TrimPrefix(testenv.KafkaURL(t), "kafka://")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "nosuch")
	lag := &kafkaLag{conn: kafkaConn{brokers: brokers}}
	defer func() { _ = lag.close() }()
	if _, err := lag.read(ctx, topic, "billing"); err == nil || !strings.Contains(err.Error(), "topic "+topic+" does not exist") {
		t.Fatalf("read = %v; want an error saying topic %s does not exist", err, topic)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	listed, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if listed.Has(topic) {
		_, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), topic)
		t.Fatalf("reading the lag created topic %s", topic)
	}
}

// A broker that refuses the group's or the topic's offsets (ACLs) gives an access-denied error,
// which names what was refused; an outage gives an unreachable one. The errors are built as kadm
// returns them: kfake, as the tests run it, enforces no ACLs.
func TestKafkaLag_RefusalIsAccessDenied(t *testing.T) {
	for _, refused := range []*kerr.Error{kerr.GroupAuthorizationFailed, kerr.TopicAuthorizationFailed} {
		err := classifyKafka(fmt.Errorf("read the offsets group billing committed: %w", &kadm.AuthError{Err: refused}))
		if !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) || !strings.Contains(err.Error(), refused.Message) {
			t.Errorf("%v: want an access-denied error that says so", err)
		}
	}
	if err := classifyKafka(fmt.Errorf("read the newest offsets of topic t: %w", kerr.NotLeaderForPartition)); !outboxkit.IsUnreachable(err) {
		t.Errorf("%v: want an unreachable error", err)
	}
}
