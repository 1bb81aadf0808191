package backends_test

import (
	"context"
	"fmt"
	"log"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend" // registers memory://
	"github.com/outboxkit/outboxkit/pipeline"
)

// A broker opened by URL: a publisher for the forwarder and a subscriber per consumer. A service
// imports the package of its broker (backends/amqpbackend for amqp://, kafkabackend, natsbackend,
// redisbackend, postgresbackend) and compiles only that client; backends/allbackends links them all.
func ExampleOpen() {
	ctx := context.Background()
	broker, err := backends.Open(ctx, "memory://", backends.Options{
		// RabbitMQ declares these consumers' queues before the first publish, so that a consumer
		// deployed after the producer misses nothing; other brokers keep messages by themselves.
		Consumers: map[string][]string{"orders": {"shipping", "billing"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()

	sub, err := broker.NewSubscriber("shipping")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	if err := broker.Publisher.Publish("orders", pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{"id":"o-1"}`))); err != nil {
		log.Fatal(err)
	}
	m := <-msgs
	m.Ack()
	fmt.Println(sub.Consumer(), string(m.Payload))
	// Output: shipping {"id":"o-1"}
}
