package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Delivery is a message a test queue received.
type Delivery struct {
	UUID    string
	Headers map[string]string
	Body    []byte
	amqp.Delivery
}

// Queue is a durable queue bound to a topic's fanout exchange, consumed by the test and deleted
// (with the exchange) when the test ends.
type Queue struct {
	mu       sync.Mutex
	received []Delivery
	arrived  chan struct{}
}

// BindQueue declares the exchange for topic and a queue bound to it, and collects what arrives.
func BindQueue(t testing.TB, url, topic string) *Queue {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := topic + "_testqueue"
	must := func(err error) {
		if err != nil {
			t.Fatalf("declare test queue: %v", err)
		}
	}
	must(ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil))
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	must(err)
	must(ch.QueueBind(queue, "", topic, false, nil))
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	must(err)

	q := &Queue{arrived: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			headers := map[string]string{}
			for k, v := range d.Headers {
				headers[k] = fmt.Sprint(v)
			}
			q.mu.Lock()
			q.received = append(q.received, Delivery{UUID: d.MessageId, Headers: headers, Body: d.Body, Delivery: d})
			q.mu.Unlock()
			_ = d.Ack(false)
			select {
			case q.arrived <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(topic, false, false)
		_ = conn.Close()
		<-done
	})
	return q
}

// Received returns a copy of what has arrived so far.
func (q *Queue) Received() []Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]Delivery(nil), q.received...)
}

// WaitFor waits until at least n messages have arrived.
func (q *Queue) WaitFor(t testing.TB, n int, within time.Duration) []Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		got := q.Received()
		if len(got) >= n {
			return got
		}
		select {
		case <-q.arrived:
		case <-ctx.Done():
			t.Fatalf("%d of %d messages arrived within %s", len(got), n, within)
		}
	}
}

// DeclareQueue declares topic's fanout exchange and a durable queue bound to it, as a watermill-amqp
// subscriber of that consumer group would (queue "<topic>_<group>"), so messages published before
// the consumer starts are kept. Both are deleted when the test ends.
func DeclareQueue(t testing.TB, url, topic, group string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := topic + "_" + group
	if err := ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "", topic, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(topic, false, false)
		}
	})
}

// DeleteWhenDone deletes topic's exchange and the queues of groups when the test ends, for
// topology a program under test declared itself.
func DeleteWhenDone(t testing.TB, url, topic string, groups ...string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, g := range groups {
			_, _ = ch.QueueDelete(topic+"_"+g, false, false, false)
		}
		_ = ch.ExchangeDelete(topic, false, false)
	})
}
