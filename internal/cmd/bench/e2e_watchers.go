package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// probeDeliveries consumes, with automatic acknowledgements, an exclusive queue bound to each of
// topics' exchanges, and records when each message (by id) arrived. stop closes it, and with it
// the queues.
func probeDeliveries(url string, topics []string, arrived *sync.Map) (stop func(), err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	for _, t := range topics {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err == nil {
			err = ch.QueueBind(q.Name, "", t, false, nil)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
		}
		if err != nil {
			conn.Close()
			wg.Wait()
			return nil, fmt.Errorf("probe queue on %s: %w", t, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				arrived.LoadOrStore(d.MessageId, time.Now())
			}
		}()
	}
	return func() { conn.Close(); wg.Wait() }, nil
}

// ackWatcher is a subscriber that calls record with a message's UUID once it is acknowledged: for
// the batch consumer, after the batch's transaction committed.
type ackWatcher struct {
	message.Subscriber
	record func(uuid string)
	clock  *stageClock // when set, told when each message is handed out
}

// Unacked is what the watched subscriber hands out at once, when it says (the batch consumer
// asks).
func (w ackWatcher) Unacked() int {
	if u, ok := w.Subscriber.(interface{ Unacked() int }); ok {
		return u.Unacked()
	}
	return 1
}

func (w ackWatcher) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message, cap(in))
	go func() {
		defer close(out)
		for m := range in {
			if w.clock != nil {
				w.clock.subReceived(m.UUID)
			}
			go func() {
				select {
				case <-m.Acked():
					w.record(m.UUID)
				case <-m.Nacked():
				case <-ctx.Done():
				}
			}()
			out <- m
		}
	}()
	return out, nil
}
