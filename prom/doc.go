// Package prom exports outboxkit's metrics to Prometheus: the forwarder's
// (NewForwarderMetrics, for forwarder.Config.Metrics), each consumer's (NewConsumerMetrics, for
// middleware.StackConfig.Metrics), the backlog brokers hold for consumer groups
// (NewLagCollector), a relay fleet as its coordination database tells it (NewFleetMetrics), what
// one member of a fleet does with its leases and forwarders (NewMemberMetrics), and the log relays
// as their database tells them: a Postgres log relay's replication slot (NewSlotCollector), a
// binlog relay group's checkpoint and lag behind the binary log of MySQL or MariaDB
// (NewBinlogCollector).
// The forwarder and the middleware import no metrics library; a program that wants these imports
// this package.
//
// Series that the store answers — the outbox's backlog, a consumer's dead letters waiting, which
// member of a fleet owns which outbox — are read at scrape time, so they are right even when no
// relay or consumer runs in the process that exports them. Several forwarders or consumers in one
// process share a registry: their series differ by the forwarder and consumer labels.
package prom
