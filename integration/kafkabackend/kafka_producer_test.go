package kafkabackend_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
)

// newPlainCluster is an in-process Kafka without TLS or SASL, with topics of two partitions.
func newPlainCluster(t *testing.T, topics ...string) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()[0]
}

func openKafka(t *testing.T, url string) *backends.Backend {
	t.Helper()
	b, err := backends.Open(context.Background(), url, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// withDeadline gives msg a context that ends in d.
func withDeadline(t *testing.T, msg *message.Message, d time.Duration) *message.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	msg.SetContext(ctx)
	return msg
}

// keyedUnmarshaler is watermill-kafka's DefaultMarshaler, which also says what key the record had.
type keyedUnmarshaler struct{ wkafka.DefaultMarshaler }

func (u keyedUnmarshaler) Unmarshal(cm *sarama.ConsumerMessage) (*message.Message, error) {
	msg, err := u.DefaultMarshaler.Unmarshal(cm)
	if err == nil {
		msg.Metadata.Set("test_record_key", string(cm.Key))
	}
	return msg, err
}

// A stock watermill-kafka subscriber (Sarama, its DefaultMarshaler) reads what the backend's
// producer wrote: the UUID, the payload, the metadata, and the partition key as the record key.
func TestKafka_StockWatermillSubscriberReadsWhatThePublisherWrote(t *testing.T) {
	const topic = "stock.orders"
	_, addr := newPlainCluster(t, topic)
	b := openKafka(t, "kafka://"+addr)
	msg := message.NewMessage("0192-stock", []byte(`{"order":7}`))
	msg.Metadata.Set(outboxkit.MetadataPartitionKey, "order-7")
	msg.Metadata.Set("tenant", "acme")
	if err := b.Publisher.Publish(topic, withDeadline(t, msg, 10*time.Second)); err != nil {
		t.Fatal(err)
	}

	cfg := wkafka.DefaultSaramaSubscriberConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{Brokers: []string{addr}, Unmarshaler: keyedUnmarshaler{},
		ConsumerGroup: "stock-readers", OverwriteSaramaConfig: cfg}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-msgs:
		got.Ack()
		if got.UUID != "0192-stock" || !bytes.Equal(got.Payload, msg.Payload) || got.Metadata.Get("tenant") != "acme" ||
			outboxkit.PartitionKey(got) != "order-7" || got.Metadata.Get("test_record_key") != "order-7" {
			t.Fatalf("the stock subscriber read %s %s %v; want %s %s %v keyed order-7", got.UUID, got.Payload, got.Metadata,
				msg.UUID, msg.Payload, msg.Metadata)
		}
	case <-ctx.Done():
		t.Fatal("the stock subscriber read nothing")
	}
}

// The producer's errors, classified: a record larger than any batch is refused for good
// (outboxkit.Permanent: trying again cannot help), a cluster that is gone is Unreachable, at
// Publish and at Check.
func TestKafka_PublisherClassifiesItsErrors(t *testing.T) {
	const topic = "errors.orders"
	c, addr := newPlainCluster(t, topic)
	b := openKafka(t, "kafka://"+addr)
	if err := b.Publisher.Publish(topic, withDeadline(t, message.NewMessage("small", []byte(`{}`)), 10*time.Second)); err != nil {
		t.Fatalf("a small record: %v", err)
	}
	huge := message.NewMessage("huge", bytes.Repeat([]byte("x"), 2<<20)) // franz-go's batch limit is 1 MiB
	err := b.Publisher.Publish(topic, withDeadline(t, huge, 10*time.Second))
	if !outboxkit.IsPermanent(err) || outboxkit.IsUnreachable(err) {
		t.Fatalf("a 2 MiB record: %v; want a permanent error", err)
	}
	checker, ok := b.Publisher.(interface{ Check(context.Context) error })
	if !ok {
		t.Fatalf("the publisher %T has no Check", b.Publisher)
	}
	if err := checker.Check(context.Background()); err != nil {
		t.Fatalf("Check with the cluster up: %v", err)
	}

	c.Close() // the broker is gone: its port refuses connections
	err = b.Publisher.Publish(topic, withDeadline(t, message.NewMessage("later", []byte(`{}`)), 3*time.Second))
	if !outboxkit.IsUnreachable(err) {
		t.Fatalf("publish to a closed broker: %v; want an unreachable error", err)
	}
	if err := checker.Check(context.Background()); !outboxkit.IsUnreachable(err) {
		t.Fatalf("Check of a closed broker: %v; want an unreachable error", err)
	}

	// A port nothing listens on, from the start.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	_ = l.Close()
	b2 := openKafka(t, "kafka://"+dead)
	if err := b2.Publisher.Publish(topic, withDeadline(t, message.NewMessage("none", nil), 3*time.Second)); !outboxkit.IsUnreachable(err) {
		t.Fatalf("publish to %s, where no broker listens: %v; want an unreachable error", dead, err)
	}
}

// Consumers read only committed records by default: a record of a transaction its producer
// aborted is not handed out; isolation=read_uncommitted hands it out.
func TestKafka_ConsumersReadCommittedByDefault(t *testing.T) {
	const topic = "txn.orders"
	_, addr := newPlainCluster(t, topic)
	p, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID("aborting-producer"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	produce := func(uuid string, commit kgo.TransactionEndTry) {
		t.Helper()
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Key: []byte("k"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: []byte(uuid)}}}
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := p.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	produce("aborted", kgo.TryAbort)
	produce("committed", kgo.TryCommit)

	read := func(url, group string, n int) []string {
		t.Helper()
		b := openKafka(t, url)
		sub, err := b.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for len(got) < n {
			select {
			case m := <-msgs:
				m.Ack()
				got = append(got, m.UUID)
			case <-ctx.Done():
				t.Fatalf("%s: read %v, want %d records", url, got, n)
			}
		}
		return got
	}
	// Both records are on one partition (one key), the aborted one first: the first record read
	// being the committed one proves the aborted one was skipped.
	if got := read("kafka://"+addr, "committed-readers", 1); got[0] != "committed" {
		t.Fatalf("read_committed (the default) read %v first; want the committed record", got)
	}
	if got := read("kafka://"+addr+"?isolation=read_uncommitted", "uncommitted-readers", 2); got[0] != "aborted" || got[1] != "committed" {
		t.Fatalf("isolation=read_uncommitted read %v; want the aborted record, then the committed one", got)
	}
}
