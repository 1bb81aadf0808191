package backends

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
)

// Lag is what the broker holds for one consumer group of one topic, read when asked: the slow
// consumer's side of the pipeline, which the outbox's backlog cannot show.
type Lag struct {
	// Waiting is how many of the topic's messages the group has not been handed yet: RabbitMQ's
	// ready messages in the group's queue, JetStream's pending count for the group's consumer,
	// Redis Streams' group lag. On Kafka, where the committed offset is the acknowledgement, it
	// is everything after the group's committed offsets, handed out or not.
	Waiting int64
	// Unacked is how many the group's consumers hold without having acknowledged them (being
	// handled, or stranded with a consumer that died). HasUnacked is false where the broker
	// cannot say (RabbitMQ over AMQP 0-9-1; Kafka, where Waiting includes them).
	Unacked    int64
	HasUnacked bool
	// OldestAge is how long the oldest message the group has not acknowledged has been in the
	// broker; HasAge is false where the broker cannot say (RabbitMQ) or nothing waits.
	OldestAge time.Duration
	HasAge    bool
}

// ErrLagUnknown is returned by Lag for a backend that cannot report a consumer group's backlog:
// memory:// (Watermill's in-process channel holds nothing to count).
var ErrLagUnknown = errors.New("this backend cannot report a consumer group's backlog")

// ReportsLag reports whether Lag can read this backend's consumer groups (not memory://).
func (b *Backend) ReportsLag() bool { return b.lag != nil }

// Lag reads how far consumer group group is behind on topic, from the broker, now. It opens what
// it needs on first use and keeps it until Close; it is safe for concurrent use.
func (b *Backend) Lag(ctx context.Context, topic, group string) (Lag, error) {
	if b.lag == nil {
		return Lag{}, fmt.Errorf("%s://: %w", b.Scheme, ErrLagUnknown)
	}
	l, err := b.lag(ctx, topic, group)
	if err != nil {
		return Lag{}, fmt.Errorf("backlog of group %s on %s: %w", group, topic, err)
	}
	return l, nil
}

// ageOf is the age of something the broker stamped at t, never negative.
func ageOf(t time.Time) time.Duration { return max(0, time.Since(t)) }

// amqpLag reads the group's queue with a passive declare. AMQP 0-9-1 tells the ready messages and
// nothing else: the unacknowledged count and the messages' ages are in the management plugin's
// HTTP API, not in the protocol.
type amqpLag struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

func (a *amqpLag) read(ctx context.Context, topic, group string) (Lag, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil || a.conn.IsClosed() {
		conn, err := amqp.DialConfig(a.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second), Properties: amqp.Table{"connection_name": "outboxkit-lag"}})
		if err != nil {
			return Lag{}, err
		}
		a.conn = conn
	}
	ch, err := a.conn.Channel()
	if err != nil {
		return Lag{}, err
	}
	defer ch.Close()
	queue := wamqp.GenerateQueueNameTopicNameWithSuffix(group)(topic)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return Lag{}, fmt.Errorf("queue %s (has the group subscribed yet?): %w", queue, err)
	}
	return Lag{Waiting: int64(q.Messages)}, nil
}

func (a *amqpLag) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		return a.conn.Close()
	}
	return nil
}

// redisLag reads XINFO GROUPS (the group's lag and pending entries) and the ids of the oldest
// entry not acknowledged, which are its time in milliseconds.
func redisLag(client *redis.Client) func(ctx context.Context, topic, group string) (Lag, error) {
	return func(ctx context.Context, topic, group string) (Lag, error) {
		groups, err := client.XInfoGroups(ctx, topic).Result()
		if err != nil {
			return Lag{}, classifyRedis(err)
		}
		for _, g := range groups {
			if g.Name != group {
				continue
			}
			l := Lag{Waiting: max(g.Lag, 0), Unacked: g.Pending, HasUnacked: true}
			oldest := ""
			if g.Pending > 0 {
				if p, err := client.XPending(ctx, topic, group).Result(); err == nil {
					oldest = p.Lower
				}
			} else if g.Lag > 0 {
				if next, err := client.XRangeN(ctx, topic, "("+g.LastDeliveredID, "+", 1).Result(); err == nil && len(next) == 1 {
					oldest = next[0].ID
				}
			}
			if ms, _, ok := strings.Cut(oldest, "-"); ok {
				if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
					l.OldestAge, l.HasAge = ageOf(time.UnixMilli(n)), true
				}
			}
			return l, nil
		}
		return Lag{}, fmt.Errorf("no consumer group %s on stream %s (has the group subscribed yet?)", group, topic)
	}
}

// natsLag reads the group's durable consumer: pending (not yet delivered) and ack-pending counts,
// and the time of the first message after its ack floor.
type natsLag struct {
	connect func(name string) (*nats.Conn, error)
	mu      sync.Mutex
	conn    *nats.Conn
	js      jetstream.JetStream
}

func (n *natsLag) read(ctx context.Context, topic, group string) (Lag, error) {
	n.mu.Lock()
	if n.conn == nil {
		conn, err := n.connect("outboxkit-lag")
		if err != nil {
			n.mu.Unlock()
			return Lag{}, err
		}
		js, err := jetstream.New(conn)
		if err != nil {
			conn.Close()
			n.mu.Unlock()
			return Lag{}, err
		}
		n.conn, n.js = conn, js
	}
	js := n.js
	n.mu.Unlock()
	stream, err := js.Stream(ctx, natsStream(topic))
	if err != nil {
		return Lag{}, classifyNATS(err)
	}
	consumer, err := stream.Consumer(ctx, natsStream("outboxkit_"+group))
	if err != nil {
		return Lag{}, fmt.Errorf("consumer of group %s (has the group subscribed yet?): %w", group, classifyNATS(err))
	}
	info, err := consumer.Info(ctx)
	if err != nil {
		return Lag{}, classifyNATS(err)
	}
	l := Lag{Waiting: int64(info.NumPending), Unacked: int64(info.NumAckPending), HasUnacked: true}
	if l.Waiting+l.Unacked > 0 {
		if msg, err := stream.GetMsg(ctx, info.AckFloor.Stream+1); err == nil {
			l.OldestAge, l.HasAge = ageOf(msg.Time), true
		}
	}
	return l, nil
}

func (n *natsLag) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn != nil {
		n.conn.Close()
	}
	return nil
}

// kafkaLag sums, over the topic's partitions, the newest offset minus the group's committed one,
// and reads the timestamp of the first record not committed on each partition behind. One client
// serves every read (every group, every scrape); a failed read drops it, the next dials again.
type kafkaLag struct {
	brokers []string
	mu      sync.Mutex
	client  sarama.Client
}

func (k *kafkaLag) read(ctx context.Context, topic, group string) (Lag, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client == nil {
		cfg := sarama.NewConfig()
		cfg.Version = kafkaVersion
		cfg.Net.DialTimeout = 5 * time.Second
		cfg.Consumer.Return.Errors = true
		client, err := sarama.NewClient(k.brokers, cfg)
		if err != nil {
			return Lag{}, classifyKafka(err)
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

func kafkaGroupLag(ctx context.Context, client sarama.Client, topic, group string) (Lag, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return Lag{}, classifyKafka(err)
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		return Lag{}, classifyKafka(err)
	}
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return Lag{}, classifyKafka(err)
	}
	req := &sarama.OffsetFetchRequest{Version: 1, ConsumerGroup: group}
	for _, p := range partitions {
		req.AddPartition(topic, p)
	}
	resp, err := coordinator.FetchOffset(req)
	if err != nil {
		return Lag{}, classifyKafka(err)
	}
	var l Lag
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return Lag{}, classifyKafka(err)
	}
	defer consumer.Close()
	for _, p := range partitions {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return Lag{}, classifyKafka(err)
		}
		committed := int64(-1)
		if block := resp.GetBlock(topic, p); block != nil && block.Err == sarama.ErrNoError {
			committed = block.Offset
		}
		if committed < 0 { // nothing committed: the group starts from the oldest record
			if committed, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
				return Lag{}, classifyKafka(err)
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
		return ageOf(m.Timestamp), true
	case <-pc.Errors():
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
	}
	return 0, false
}
