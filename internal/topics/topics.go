// Package topics removes what a run left of a topic on a shared broker: the bench's drains and the
// chaos soak's streams.
package topics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// Remove deletes topic from the broker at rawURL (scheme amqp, nats, redis or postgres), and on
// RabbitMQ the queues named; best effort, bounded by 10 s. Kafka and memory:// keep nothing to remove
// here (the tests' Kafka is an in-memory kfake).
func Remove(rawURL, scheme, topic string, amqpQueues ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch scheme {
	case "amqp":
		if conn, err := amqp.Dial(rawURL); err == nil {
			if ch, err := conn.Channel(); err == nil {
				for _, q := range amqpQueues {
					_, _ = ch.QueueDelete(q, false, false, false)
				}
				_ = ch.ExchangeDelete(topic, false, false)
			}
			_ = conn.Close()
		}
	case "nats":
		if nc, err := nats.Connect(rawURL); err == nil {
			if js, err := jetstream.New(nc); err == nil {
				_ = js.DeleteStream(ctx, strings.ReplaceAll(topic, ".", "_"))
			}
			nc.Close()
		}
	case "redis":
		if opt, err := redis.ParseURL(rawURL); err == nil {
			rc := redis.NewClient(opt)
			_ = rc.Del(ctx, topic).Err()
			_ = rc.Close()
		}
	case "postgres":
		if pool, err := pgxpool.New(ctx, rawURL); err == nil {
			_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s", "watermill_offsets_%s"`, topic, topic))
			pool.Close()
		}
	}
}
