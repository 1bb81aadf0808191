// Package backends builds the broker side of outboxkit from a URL: a Watermill Publisher for the
// forwarder and a Subscriber for each consumer, with at-least-once settings on (publisher
// confirms, durable queues and streams, manual acknowledgements).
//
// Each broker lives in a package of its own that registers its URL schemes here when imported,
// the way database/sql drivers do, so that a service compiles only the client of the broker it
// uses:
//
//	import _ "github.com/outboxkit/outboxkit/backends/amqpbackend"     // amqp://, amqps:// (RabbitMQ)
//	import _ "github.com/outboxkit/outboxkit/backends/kafkabackend"    // kafka://
//	import _ "github.com/outboxkit/outboxkit/backends/natsbackend"     // nats://, tls:// (JetStream)
//	import _ "github.com/outboxkit/outboxkit/backends/redisbackend"    // redis://, rediss:// (Streams)
//	import _ "github.com/outboxkit/outboxkit/backends/postgresbackend" // postgres:// (a watermill-sql topic)
//	import _ "github.com/outboxkit/outboxkit/backends/memorybackend"   // memory:// (in-process)
//
// Package backends/allbackends imports them all, for tools that take any URL. Open with a scheme
// whose package is not imported fails with an error that names the import to add.
package backends
