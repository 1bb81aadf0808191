// Package fleet spreads the relaying of many outboxes — a database or a schema per tenant, or the
// shards of one service, on any of outboxkit's stores — over a fleet of relay processes, any of
// which may die or be added while it runs.
//
// Membership and ownership are leases in a coordination database the team already runs (a table
// in Postgres, MySQL or SQLite, see store.FleetControl): each member heartbeats, each outbox has
// one owner at a time, chosen by rendezvous hashing over the live members so that a join or a
// departure moves only the outboxes it must, and each lease carries a fencing token that only
// grows. An owner stops publishing before its lease can be taken from it, and stamps each message
// with its tenant, its outbox and its token (outboxkit_tenant, outboxkit_outbox,
// outboxkit_lease_token metadata), so a late publish by a stale owner is visible downstream.
//
// ReadStatus tells who owns what and which outboxes have no owner, from the coordination database
// alone.
package fleet
