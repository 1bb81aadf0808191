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
//
// # A member
//
// A Member (New, then Run) is one relay process. Every RenewInterval it heartbeats and renews all
// its leases in one statement each. Every Tick it reads the Catalog (Outboxes from
// configuration, TableCatalog from the application's table of tenants, or a CatalogFunc) and the
// fleet's live members, and places each enabled outbox on one member: the member of highest
// rendezvous score among those with fewer than their share (⌈outboxes/members⌉), so that every
// member computes the same placement, a member that joins takes about its share and no more, and
// none relays more than its share however few the outboxes. A member acquires the free outboxes
// placed on it; it hands an outbox placed on another member over — stops its forwarder, then
// releases the lease — once that member has been live for a tick, so that a member that flaps
// moves nothing. An outbox that its member has not taken within two ticks (its catalog is behind,
// say) is taken by any member, and handed back later.
//
// For each outbox it holds, a member opens the store (Config.Open; fleetstores.Opener shares one
// database handle among all the schemas of a database), and runs a forwarder built from
// Config.Forwarder, named after the outbox, publishing through Config.Publisher — one broker
// connection for every outbox. An outbox that cannot be opened, or whose relay fails, is tried
// again with a growing pause and shows its error in Status; it holds back no other outbox. An
// idle outbox costs next to nothing: its forwarder's poll slows down to IdlePollInterval
// (DefaultIdlePoll where writers wake relays, DefaultIdlePollWithoutWake where they do not).
//
// # Fencing
//
// A member measures each lease on its own monotonic clock from the moment it sent the last renewal
// that succeeded: the lease cannot expire before LeaseTTL has passed since then, by the
// coordination database's clock. StopBefore earlier, if no renewal has succeeded meanwhile, the
// outbox's publisher refuses to publish and its forwarder is stopped; a renewal that does not
// return a lease stops its relay at once. So a member cut off from the coordination database, or
// paused, stops publishing before another member can acquire its outboxes, and the fencing token
// on each message shows the order of owners to a consumer that checks it. A publish the broker has
// not confirmed when its owner stops may still arrive; like any publish whose mark did not commit,
// it is published again by the next owner — a duplicate, never a loss.
//
// # Costs
//
// For M outboxes and N members, each member writes its heartbeat and one renewal every
// RenewInterval, reads the members and the leases every Tick, and records the catalog (M rows)
// every fifth Tick or when it changed. On Postgres each member holds one connection pool and one
// LISTEN connection per database (fleetstores), whatever the number of schemas on it; the log
// relay (RelayLog) holds a replication connection per outbox.
package fleet
