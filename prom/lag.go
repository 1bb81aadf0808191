package prom

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit/backends"
)

// NewLagCollector exports, at each scrape, the backlog the broker holds for each consumer group of
// topic, as Lag reads it:
//
//	outboxkit_consumer_broker_waiting{consumer, topic}              messages not yet handed to the group
//	outboxkit_consumer_broker_unacked{consumer, topic}              handed out, not acknowledged (where the broker tells)
//	outboxkit_consumer_broker_oldest_age_seconds{consumer, topic}   age of the oldest not acknowledged (where the broker tells)
//
// A group whose backlog cannot be read at a scrape (the broker down, the group not subscribed
// yet) has no series in that scrape rather than a wrong one, and the scrape's other series are
// kept: the broker's outage has alerts of its own. A backend that cannot report lag at all
// (memory://) exports nothing.
func NewLagCollector(b *backends.Backend, topic string, groups ...string) prometheus.Collector {
	return &lagCollector{b: b, topic: topic, groups: groups}
}

var (
	lagWaitingDesc = prometheus.NewDesc("outboxkit_consumer_broker_waiting",
		"Messages of the topic the consumer group has not been handed yet, read from the broker at scrape time.",
		[]string{"consumer", "topic"}, nil)
	lagUnackedDesc = prometheus.NewDesc("outboxkit_consumer_broker_unacked",
		"Messages handed to the consumer group and not acknowledged yet, read from the broker at scrape time.",
		[]string{"consumer", "topic"}, nil)
	lagAgeDesc = prometheus.NewDesc("outboxkit_consumer_broker_oldest_age_seconds",
		"Age of the oldest message the consumer group has not acknowledged, read from the broker at scrape time.",
		[]string{"consumer", "topic"}, nil)
)

type lagCollector struct {
	b      *backends.Backend
	topic  string
	groups []string
}

// Describe describes nothing: the collector is unchecked, so that collectors for several topics
// (whose series share names and differ by label) can share a registry.
func (c *lagCollector) Describe(chan<- *prometheus.Desc) {}

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, g := range c.groups {
		l, err := c.b.Lag(ctx, c.topic, g)
		if errors.Is(err, backends.ErrLagUnknown) {
			return
		}
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(lagWaitingDesc, prometheus.GaugeValue, float64(l.Waiting), g, c.topic)
		if l.HasUnacked {
			ch <- prometheus.MustNewConstMetric(lagUnackedDesc, prometheus.GaugeValue, float64(l.Unacked), g, c.topic)
		}
		if l.HasAge {
			ch <- prometheus.MustNewConstMetric(lagAgeDesc, prometheus.GaugeValue, l.OldestAge.Seconds(), g, c.topic)
		} else if l.Waiting == 0 && (!l.HasUnacked || l.Unacked == 0) && c.b.Scheme != "amqp" {
			ch <- prometheus.MustNewConstMetric(lagAgeDesc, prometheus.GaugeValue, 0, g, c.topic)
		}
	}
}
