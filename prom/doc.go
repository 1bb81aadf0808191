// Package prom exports outboxkit's metrics to Prometheus: the forwarder's
// (NewForwarderMetrics, for forwarder.Config.Metrics), each consumer's (NewConsumerMetrics, for
// middleware.StackConfig.Metrics) and the backlog brokers hold for consumer groups
// (NewLagCollector). The forwarder and the middleware import no metrics library; a program that
// wants these imports this package.
//
// Series that the store answers — the outbox's backlog, a consumer's dead letters waiting — are
// read at scrape time, so they are right even when no relay or consumer runs in the process that
// exports them. Several forwarders or consumers in one process share a registry: their series
// differ by the forwarder and consumer labels.
package prom
