// Package outboxkit holds the vocabulary shared by every outboxkit package: the metadata keys an
// outbox message carries from the business transaction to every consumer, and the error markers
// that separate "the broker could not be reached" from "this message is bad".
//
// The moving parts live in sub-packages:
//
//   - pipeline: the outbox table, its migrations, and the transaction-bound Watermill publisher.
//   - forwarder: the relay that moves committed outbox rows to a broker.
//   - backends: Watermill publishers and subscribers for each broker, built from a URL.
//   - middleware and handlers: the consumer side (inbox, retries, dead letters).
package outboxkit
