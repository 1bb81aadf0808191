// Package allbackends links every broker package into the program, so that backends.Open opens any
// broker URL: amqp:// (RabbitMQ), kafka://, nats:// (JetStream), redis:// (Streams), postgres://
// (a watermill-sql topic) and memory://. A service on one broker imports that broker's package
// alone and compiles only its client; tools that take any URL (outboxctl, the demo) import this one.
package allbackends

import (
	_ "github.com/outboxkit/outboxkit/backends/amqpbackend"     // amqp://, amqps://
	_ "github.com/outboxkit/outboxkit/backends/kafkabackend"    // kafka://
	_ "github.com/outboxkit/outboxkit/backends/memorybackend"   // memory://
	_ "github.com/outboxkit/outboxkit/backends/natsbackend"     // nats://, tls://
	_ "github.com/outboxkit/outboxkit/backends/postgresbackend" // postgres://
	_ "github.com/outboxkit/outboxkit/backends/redisbackend"    // redis://, rediss://
)
