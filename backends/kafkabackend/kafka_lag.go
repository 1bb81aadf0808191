package kafkabackend

import (
	"context"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// kafkaLag sums, over the topic's partitions, the newest offset minus the group's committed one,
// and reads the timestamp of the first record not committed on each partition behind. One client
// serves every read (every group, every scrape); a failed read drops it, the next dials again.
type kafkaLag struct {
	brokers []string
	mu      sync.Mutex
	client  sarama.Client
}

func (k *kafkaLag) read(ctx context.Context, topic, group string) (backends.Lag, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client == nil {
		cfg := sarama.NewConfig()
		cfg.Version = kafkaVersion
		cfg.Net.DialTimeout = 5 * time.Second
		cfg.Consumer.Return.Errors = true
		client, err := sarama.NewClient(k.brokers, cfg)
		if err != nil {
			return backends.Lag{}, classifyKafka(err)
		}
		k.client = client
	}
	l, err := kafkaGroupLag(ctx, k.client, topic, group)
	if err != nil {
		_ = k.client.Close()
		k.client = nil
	}
	return l, err
}

func (k *kafkaLag) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil {
		return k.client.Close()
	}
	return nil
}

func kafkaGroupLag(ctx context.Context, client sarama.Client, topic, group string) (backends.Lag, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return backends.Lag{}, classifyKafka(err)
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		return backends.Lag{}, classifyKafka(err)
	}
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return backends.Lag{}, classifyKafka(err)
	}
	req := &sarama.OffsetFetchRequest{Version: 1, ConsumerGroup: group}
	for _, p := range partitions {
		req.AddPartition(topic, p)
	}
	resp, err := coordinator.FetchOffset(req)
	if err != nil {
		return backends.Lag{}, classifyKafka(err)
	}
	var l backends.Lag
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return backends.Lag{}, classifyKafka(err)
	}
	defer consumer.Close()
	for _, p := range partitions {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return backends.Lag{}, classifyKafka(err)
		}
		committed := int64(-1)
		if block := resp.GetBlock(topic, p); block != nil && block.Err == sarama.ErrNoError {
			committed = block.Offset
		}
		if committed < 0 { // nothing committed: the group starts from the oldest record
			if committed, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
				return backends.Lag{}, classifyKafka(err)
			}
		}
		behind := newest - committed
		if behind <= 0 {
			continue
		}
		l.Waiting += behind
		if age, ok := kafkaRecordAge(ctx, consumer, topic, p, committed); ok && age > l.OldestAge {
			l.OldestAge, l.HasAge = age, true
		}
	}
	return l, nil
}

// kafkaRecordAge reads the record at offset and returns how old its timestamp is.
func kafkaRecordAge(ctx context.Context, consumer sarama.Consumer, topic string, partition int32, offset int64) (time.Duration, bool) {
	pc, err := consumer.ConsumePartition(topic, partition, offset)
	if err != nil {
		return 0, false
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		return brokerio.AgeOf(m.Timestamp), true
	case <-pc.Errors():
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
	}
	return 0, false
}
