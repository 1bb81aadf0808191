package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// dropWhenDone removes, when the test ends, what a backend made on the shared broker for these
// topics and consumer groups: RabbitMQ exchanges and the "<topic>_<group>" queues, Redis streams,
// JetStream streams. Kafka runs on kfake, in memory; postgres topics live in the test's schema.
func dropWhenDone(t *testing.T, scheme, url string, topics, groups []string) {
	t.Cleanup(func() { drop(t, scheme, url, topics, groups) })
}

func drop(t *testing.T, scheme, url string, topics, groups []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch scheme {
	case "amqp":
		dropAMQP(t, url, topics, groups)
	case "redis":
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		client := redis.NewClient(opts)
		defer client.Close()
		if len(topics) > 0 {
			if err := client.Del(ctx, topics...).Err(); err != nil {
				t.Errorf("cleanup: delete redis streams: %v", err)
			}
		}
	case "nats":
		nc, err := nats.Connect(url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, topic := range topics {
			if name, err := js.StreamNameBySubject(ctx, topic); err == nil {
				_ = js.DeleteStream(ctx, name)
			}
		}
	}
}

func dropAMQP(t *testing.T, url string, topics, groups []string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	// A failed operation closes its channel: each gets a channel of its own.
	do := func(op func(*amqp.Channel) error) {
		if ch, err := conn.Channel(); err == nil {
			_ = op(ch)
			_ = ch.Close()
		}
	}
	for _, topic := range topics {
		for _, g := range groups {
			do(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(topic+"_"+g, false, false, false); return err })
		}
		do(func(ch *amqp.Channel) error { return ch.ExchangeDelete(topic, false, false) })
	}
}

// topicLog records the topics and consumer groups a suite used, so that dropWhenDone can remove
// them when a suite names its topics itself.
type topicLog struct {
	mu             sync.Mutex
	topics, groups map[string]bool
	subs           []message.Subscriber
}

func newTopicLog() *topicLog {
	return &topicLog{topics: map[string]bool{}, groups: map[string]bool{}}
}

func (l *topicLog) add(topic, group string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if topic != "" {
		l.topics[topic] = true
	}
	if group != "" {
		l.groups[group] = true
	}
}

// dropWhenDone closes, when the test ends, the subscribers the suite left open (a live one would
// declare its queue again) and removes every topic and group recorded by then.
func (l *topicLog) dropWhenDone(t *testing.T, scheme, url string) {
	t.Cleanup(func() {
		l.mu.Lock()
		topics, groups, subs := keysOf(l.topics), keysOf(l.groups), l.subs
		l.mu.Unlock()
		for _, s := range subs {
			_ = s.Close()
		}
		drop(t, scheme, url, topics, groups)
	})
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// publisher and subscriber record every topic they are used with.
func (l *topicLog) publisher(p message.Publisher) message.Publisher {
	return loggedPublisher{Publisher: p, log: l}
}

func (l *topicLog) subscriber(s message.Subscriber, group string) message.Subscriber {
	l.add("", group)
	l.mu.Lock()
	l.subs = append(l.subs, s)
	l.mu.Unlock()
	return loggedSubscriber{Subscriber: s, log: l, group: group}
}

type loggedPublisher struct {
	message.Publisher
	log *topicLog
}

func (p loggedPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.log.add(topic, "")
	return p.Publisher.Publish(topic, msgs...)
}

type loggedSubscriber struct {
	message.Subscriber
	log   *topicLog
	group string
}

func (s loggedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.log.add(topic, s.group)
	return s.Subscriber.Subscribe(ctx, topic)
}

func (s loggedSubscriber) SubscribeInitialize(topic string) error {
	s.log.add(topic, s.group)
	if si, ok := s.Subscriber.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}
