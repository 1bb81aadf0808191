// Package middleware holds the Watermill router middleware of an effectively-once consumer:
// delivery counting, dead-lettering, retries and the inbox, plus an opt-in per-key order guard
// and metrics. Stack builds the recommended stack in the right order, outermost first:
//
//	[Tracing] → [Metrics] → Circuit → DeliveryCount → DeadLetter → Retry → Inbox → [OrderGuard] → handler
//
// Metrics sees every outcome. Circuit holds every message while a dependency (the database, a
// service the handler calls) is unreachable and probes it with backoff, so an outage delays and
// never counts toward a message's deliveries. DeliveryCount counts the delivery in its own commit before anything
// else runs, so a message that crashes the process is still counted. DeadLetter dead-letters a
// message that failed permanently or on its last allowed delivery (or that was delivered more times
// than allowed without ever finishing) and acknowledges it, so the queue keeps flowing. Retry
// retries in-process with backoff, each attempt a fresh inbox transaction. Inbox inserts the
// message's inbox row first and hands the same transaction to the handler: the effect and the row
// commit together, and a duplicate — even a concurrent one — is acknowledged without running the
// handler.
//
// AddConsumerHandler adds a handler to a Watermill router with that stack in one call, and refuses
// at once a subscriber that reads for another consumer than the stack's: the broker's group or
// queue and the inbox's rows carry one consumer name. AddTenantConsumerHandler does the same for a
// consumer serving many tenants: each message is applied behind a stack on its own tenant's store
// (outboxkit.Tenant), and one of no tenant, or of a tenant not served, is dead-lettered and applied
// nowhere.
//
// Every middleware reads and writes the database through the store seam (package store), whatever
// the database and its driver, in the tables pipeline.Migrate created; a handler gets the inbox's
// transaction in the driver's own type (pgx.Tx, *sql.Tx). None knows which broker the messages came
// from.
package middleware
