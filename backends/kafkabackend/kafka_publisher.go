package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaPublisher is the backend's producer, on franz-go: one client that every Publish call shares,
// so that concurrent calls are batched together. It is idempotent with acks from every in-sync
// replica (franz-go's defaults, stated again in kafkaProducerOpts), and synchronous: Publish
// returns once the broker has acknowledged each of its records, or with the first error. Records
// are written in watermill-kafka's format (marshalRecord), so stock watermill-kafka subscribers
// read them, and keyed by partition key on the partitions Sarama's hash partitioner chose, so that
// a key stays on its partition across an upgrade from a producer of earlier versions.
type kafkaPublisher struct {
	cl        *kgo.Client
	marshaler kafkaMarshaler
	closeOnce sync.Once
}

// Delivery bounds. A Publish whose context has no deadline still ends: a record the cluster has
// not acknowledged in kafkaDeliveryTimeout fails (outboxkit.Unreachable) and is published again
// on a later pass. Close gives the records in flight kafkaFlushTimeout to be acknowledged.
const (
	kafkaDeliveryTimeout = 30 * time.Second
	kafkaFlushTimeout    = 10 * time.Second
)

// kafkaProducerOpts are the producer's franz-go options, on the URL's connection options.
func kafkaProducerOpts(conn kafkaConn, logger watermill.LoggerAdapter) []kgo.Opt {
	return append(conn.kgoOpts(),
		kgo.RequiredAcks(kgo.AllISRAcks()), // every in-sync replica has the record; the idempotent producer needs it
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.RecordDeliveryTimeout(kafkaDeliveryTimeout),
		kgo.AllowAutoTopicCreation(), // as Sarama's producer asked: a cluster that creates topics on first use does
		kgo.RetryBackoffFn(kafkaClientBackoff),
		kgo.WithLogger(newKgoLogger(logger, watermill.LogFields{"kafka_client": "producer"})),
	)
}

// fnv32a is the hash of Sarama's default partitioner.
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}

// newKafkaPublisher makes the producer's client. franz-go dials on the first request, not here: a
// process starts while the cluster is down.
func newKafkaPublisher(conn kafkaConn, marshaler kafkaMarshaler, logger watermill.LoggerAdapter) (*kafkaPublisher, error) {
	cl, err := kgo.NewClient(kafkaProducerOpts(conn, logger)...)
	if err != nil {
		return nil, fmt.Errorf("kafka publisher: %w", err)
	}
	return &kafkaPublisher{cl: cl, marshaler: marshaler}, nil
}

// Publish writes msgs to topic and returns once every one is acknowledged. The first message's
// context bounds it: records not yet sent when it ends are not sent. Errors are left to
// classifyKafka (brokerio.BoundedPublisher classifies them).
func (p *kafkaPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, msg := range msgs {
		r, err := p.marshaler.marshalRecord(topic, msg)
		if err != nil {
			return fmt.Errorf("kafka publisher: message %s: %w", msg.UUID, err)
		}
		recs[i] = r
	}
	if err := p.cl.ProduceSync(msgs[0].Context(), recs...).FirstErr(); err != nil {
		return fmt.Errorf("kafka publisher: publish to %s: %w", topic, err)
	}
	return nil
}

// Close waits up to kafkaFlushTimeout for the records in flight to be acknowledged, then closes
// the client; records still unacknowledged fail, and their Publish calls return the error.
func (p *kafkaPublisher) Close() error {
	var err error
	p.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), kafkaFlushTimeout)
		defer cancel()
		if ferr := p.cl.Flush(ctx); ferr != nil && !errors.Is(ferr, context.DeadlineExceeded) {
			err = fmt.Errorf("kafka publisher: flush: %w", ferr)
		}
		p.cl.Close()
	})
	return err
}
