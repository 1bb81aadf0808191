package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit"
)

// arrivals consumes a fresh queue bound to a topic's exchange and records when messages arrive:
// the first and the last, and each one's key as it comes (what the join part waits for). It
// checks per-key order as counter does; the keys of many tenants must differ.
type arrivals struct {
	conn  *amqp.Connection
	queue string
	topic string
	want  int
	done  chan struct{}
	keys  chan keyArrival // each arrival, for a reader that waits on keys; dropped when full

	mu          sync.Mutex
	got         int
	first, last time.Time
	lastSeq     map[string]int64
	orderErr    error
	tenants     map[string]bool // whose first message arrived: a key's prefix before its first '-'
	allTenants  time.Time       // when the last of them did
}

// warmKey keys the message that declares a publisher's exchange before a drain is timed:
// arrivals does not count it.
const warmKey = "bench-warm"

type keyArrival struct {
	key string
	at  time.Time
}

// newArrivals declares topic's exchange and a queue of its own bound to it, and consumes it; done
// closes once want messages arrived (never, when want is 0).
func newArrivals(brokerURL, topic string, want int) (*arrivals, error) {
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ: %w", err)
	}
	a := &arrivals{conn: conn, queue: topic + "_bench", topic: topic, want: want, done: make(chan struct{}),
		keys: make(chan keyArrival, 1024), lastSeq: map[string]int64{}, tenants: map[string]bool{}}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil)
	}
	if err == nil {
		_, err = ch.QueueDeclare(a.queue, true, false, false, false, nil)
	}
	if err == nil {
		err = ch.QueueBind(a.queue, "", topic, false, nil)
	}
	if err == nil {
		err = ch.Qos(1000, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(a.queue, "", true, false, false, false, nil)
	}
	if err != nil {
		a.close()
		return nil, err
	}
	go func() {
		for d := range deliveries {
			a.arrived(d, time.Now())
		}
	}()
	return a, nil
}

func (a *arrivals) arrived(d amqp.Delivery, now time.Time) {
	key := fmt.Sprint(d.Headers[outboxkit.MetadataPartitionKey])
	if key == warmKey {
		return
	}
	a.mu.Lock()
	if tenant, _, _ := strings.Cut(key, "-"); !a.tenants[tenant] {
		a.tenants[tenant] = true
		a.allTenants = now
	}
	if a.got == 0 {
		a.first = now
	}
	a.last = now
	a.got++
	if seq, err := strconv.ParseInt(fmt.Sprint(d.Headers[outboxkit.MetadataSeq]), 10, 64); err == nil {
		if seq < a.lastSeq[key] && a.orderErr == nil {
			a.orderErr = fmt.Errorf("key %s: seq %d after %d", key, seq, a.lastSeq[key])
		}
		a.lastSeq[key] = seq
	}
	if a.got == a.want {
		close(a.done)
	}
	a.mu.Unlock()
	select {
	case a.keys <- keyArrival{key: key, at: now}:
	default:
	}
}

// everyTenant is when the first message of the last tenant to be heard from arrived.
func (a *arrivals) everyTenant() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.allTenants
}

// wait waits until want messages arrived, for at most within, and returns the first and the last
// arrival.
func (a *arrivals) wait(ctx context.Context, within time.Duration) (first, last time.Time, err error) {
	if err := waitFor(ctx, a.done, within, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		return fmt.Errorf("only %d of %d messages arrived within %s", a.got, a.want, within)
	}); err != nil {
		return time.Time{}, time.Time{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.orderErr != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("per-key order broken: %w", a.orderErr)
	}
	return a.first, a.last, nil
}

// waitKey waits for the message keyed key, for at most within, and returns when it arrived.
// Other keys arriving meanwhile are passed over.
func (a *arrivals) waitKey(ctx context.Context, key string, within time.Duration) (time.Time, error) {
	deadline := time.After(within)
	for {
		select {
		case k := <-a.keys:
			if k.key == key {
				return k.at, nil
			}
		case <-deadline:
			return time.Time{}, fmt.Errorf("the event of %s did not arrive within %s", key, within)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

func (a *arrivals) close() {
	if ch, err := a.conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(a.queue, false, false, false)
		_ = ch.ExchangeDelete(a.topic, false, false)
	}
	_ = a.conn.Close()
}
