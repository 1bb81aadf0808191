// Package outboxkit holds the vocabulary shared by every outboxkit package: the metadata keys an
// outbox message carries from the business transaction to every consumer (PartitionKey,
// EventType, CreatedAt, SetVersion), the error markers that tell "a dependency could not be
// reached" (Unreachable) from "it refused our credentials" (AccessDenied) and "this message can
// never succeed" (Permanent), and the transaction outboxkit hands a handler (TxFrom).
//
// The moving parts live in sub-packages, each importing only what it needs:
//
//   - store: the seam between outboxkit and the database, and store.Open, which opens a store by
//     URL; its drivers store/pgxstore (pgx), store/pgsqlstore (Postgres through database/sql),
//     store/mysqlstore and store/sqlitestore (store/allstores imports the database/sql ones).
//   - pipeline: the transaction-bound Watermill publisher that writes events into the outbox, the
//     events (NewEvent, NewJSONEvent), and Migrate.
//   - forwarder: the relay that publishes committed outbox rows to a broker.
//   - backends: a broker by URL (backends.Open); one package per broker — amqpbackend,
//     kafkabackend, natsbackend, redisbackend, postgresbackend, memorybackend — and allbackends.
//   - middleware and handlers: the consumer side — inbox, delivery count, dead letters, retries,
//     circuit, per-key order — and typed handlers that make their effect in the inbox's transaction.
//   - idempotency: net/http middleware that answers a retried request with its first response.
//   - prom: the forwarder's and the consumers' metrics, for Prometheus.
//
// Delivery is at least once everywhere; the effect is effectively once, because every consumer
// deduplicates in the transaction of its effect.
package outboxkit
