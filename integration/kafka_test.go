package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// createKafkaTopic creates topic with the given number of partitions on the broker at url.
func createKafkaTopic(t testing.TB, url, topic string, partitions int32) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin([]string{strings.TrimPrefix(url, "kafka://")}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// publishSteadily publishes an event to topic every interval, over keys keys in turn, until ctx
// ends; the channel closes once it has stopped.
func publishSteadily(ctx context.Context, pub message.Publisher, topic string, keys int, every time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			_ = pub.Publish(topic, pipeline.NewEvent("Happened", fmt.Sprintf("key-%d", i%keys), []byte(`{}`)))
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
	}()
	return done
}

// Failure matrix on Kafka, "consumer killed": a consumer process in a group is killed with
// SIGKILL again and again while events flow — it never leaves the group, its partitions stay
// assigned to a member that will not answer. The group must settle each time: once a consumer runs
// again, every event is applied, exactly once, within a bound.
func TestKafka_ConsumerKilledRepeatedlyTheGroupSettles(t *testing.T) {
	t.Parallel()
	const (
		kills    = 4
		perRound = 100
		nKeys    = 20
		// Settling takes the dead members' session timeout (6 s) and a rebalance that waits up to
		// its timeout (20 s) for them: 19–41 s measured on an idle machine. Under a loaded CI run
		// kfake once answered a JoinGroup after the client's 30 s request timeout, and the client
		// joined again (99 s). The bound proves the group settles, not how fast.
		settleMax = 180 * time.Second
	)
	pg := testenv.NewPG(t)
	createEffects(t, pgDB(pg))
	url := testenv.KafkaURL(t)
	topic := testenv.UniqueName(t, "kill") + ".placed"
	createKafkaTopic(t, url, topic, 4)
	group := testenv.UniqueName(t, "app") // groups live on in the shared broker: one of the test's own
	b := openBackend(t, url, kafkaOpts)
	storetest.RunForwarder(t, newRelay(t, pgDB(pg), b.Publisher))

	logDir := t.TempDir()
	started := 0
	start := func() *exec.Cmd {
		// Each consumer logs its group membership's every step to a file of its own, shown if the
		// test fails: a group that does not settle can be read.
		started++
		logFile := filepath.Join(logDir, fmt.Sprintf("consumer-%d.log", started))
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKafkaConsumer$", "-test.v")
		cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_KAFKA="+strings.Join([]string{pg.URL, string(pg.Schema), url, topic, group, logFile}, "|"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i := 1; i <= started; i++ {
			b, _ := os.ReadFile(filepath.Join(logDir, fmt.Sprintf("consumer-%d.log", i)))
			t.Logf("consumer %d of %d logged:\n%s", i, started, b)
		}
	})
	written := 0
	for round := 0; round < kills; round++ {
		cmd := start()
		writeEvents(t, pgDB(pg), topic, keys(nKeys), perRound/nKeys)
		written += perRound
		// Kill it at any moment: while it joins the group, while it consumes. The fault is held
		// for its random span; nothing waits on a condition here.
		<-time.After(time.Duration(300+rand.IntN(2700)) * time.Millisecond)
		kill(cmd)
	}
	writeEvents(t, pgDB(pg), topic, keys(nKeys), perRound/nKeys)
	written += perRound
	final := start()
	t.Cleanup(func() { kill(final) })
	began := time.Now()
	testenv.Eventually(t, settleMax, fmt.Sprintf("all %d events to be applied after %d kills", written, kills), func() bool {
		return countEffects(t, pgDB(pg), group) >= written
	})
	t.Logf("after %d kills the last consumer applied the backlog within %s", kills, time.Since(began).Round(100*time.Millisecond))
	if n := countEffects(t, pgDB(pg), group); n != written {
		t.Fatalf("%d effects, want exactly %d", n, written)
	}
}

// TestHelperKafkaConsumer is the consumer process of TestKafka_ConsumerKilledRepeatedlyTheGroupSettles:
// the test's group through the full stack, until it is killed.
func TestHelperKafkaConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_KAFKA")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	pg := testenv.AttachPG(t, p[0], p[1])
	logs, err := os.Create(p[5])
	if err != nil {
		t.Fatal(err)
	}
	opts := kafkaOpts
	opts.Logger = watermill.NewStdLoggerWithOut(logs, false, false)
	b := openBackend(t, p[2], opts)
	startEffectConsumer(t, context.Background(), pgDB(pg), b, p[3], p[4])
	select {} // until killed
}

// kafkaOpts are the options the Kafka tests open the backend with.
var kafkaOpts = backends.Options{}

// On a topic of several partitions the relay keys every record by its partition key: a key's
// records all land on one partition, in outbox order, and the keys spread over the partitions.
func TestKafka_RecordKeyIsThePartitionKeyAndKeysKeepTheirOrder(t *testing.T) {
	t.Parallel()
	const partitions, nKeys, perKey = 4, 20, 10
	pg := testenv.NewPG(t)
	url := testenv.KafkaURL(t)
	topic := testenv.UniqueName(t, "keyed") + ".placed"
	createKafkaTopic(t, url, topic, partitions)
	b := openBackend(t, url, kafkaOpts)
	relay := newRelay(t, pgDB(pg), b.Publisher)
	writeEvents(t, pgDB(pg), topic, keys(nKeys), perKey)
	for {
		res, err := relay.DispatchBatch(context.Background())
		if err != nil || res.UnreachableErr != nil {
			t.Fatalf("dispatch: %v %v", err, res.UnreachableErr)
		}
		if res.Claimed == 0 {
			break
		}
	}

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	consumer, err := sarama.NewConsumer([]string{strings.TrimPrefix(url, "kafka://")}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	partitionOf := map[string]int32{}
	lastSeq := map[string]int64{}
	used := map[int32]bool{}
	total := 0
	for p := int32(0); p < partitions; p++ {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		hw := pc.HighWaterMarkOffset()
		for off := int64(0); off < hw; off++ {
			var rec *sarama.ConsumerMessage
			select {
			case rec = <-pc.Messages():
			case <-time.After(10 * time.Second):
				t.Fatalf("partition %d: offset %d of %d did not arrive", p, off, hw)
			}
			headers := map[string]string{}
			for _, h := range rec.Headers {
				headers[string(h.Key)] = string(h.Value)
			}
			key := headers["outboxkit_partition_key"]
			if string(rec.Key) != key || key == "" {
				t.Fatalf("record key %q, partition key %q: the record must be keyed by its partition key", rec.Key, key)
			}
			// The partition Sarama's hash partitioner, which earlier versions produced with, chose:
			// a key stays on its partition, in order, across an upgrade.
			if want, err := sarama.NewHashPartitioner(topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, partitions); err != nil || want != p {
				t.Fatalf("key %s on partition %d; Sarama's hash partitioner puts it on %d (%v)", key, p, want, err)
			}
			if prev, ok := partitionOf[key]; ok && prev != p {
				t.Fatalf("key %s on partitions %d and %d", key, prev, p)
			}
			partitionOf[key], used[p] = p, true
			seq, _ := strconv.ParseInt(headers["outboxkit_seq"], 10, 64)
			if seq <= lastSeq[key] {
				t.Fatalf("key %s: seq %d after %d", key, seq, lastSeq[key])
			}
			lastSeq[key] = seq
			total++
		}
		_ = pc.Close()
	}
	if total != nKeys*perKey {
		t.Fatalf("%d records, want %d", total, nKeys*perKey)
	}
	if len(used) < 2 {
		t.Fatalf("%d keys all landed on %d partition(s): keys must spread", nKeys, len(used))
	}
}
