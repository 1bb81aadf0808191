package integration

import (
	"fmt"
	amqp "github.com/rabbitmq/amqp091-go"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// writeEvents commits perKey events for each key on topic, in key order, 500 per transaction.
func writeEvents(t testing.TB, db testDB, topic string, keys []string, perKey int) []*message.Message {
	t.Helper()
	var all []*message.Message
	for i := 0; i < perKey; i++ {
		for _, k := range keys {
			all = append(all, pipeline.NewEvent("Happened", k, []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i))))
		}
	}
	for start := 0; start < len(all); start += 500 {
		db.Write(t, topic, all[start:min(start+500, len(all))])
	}
	return all
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%03d", i)
	}
	return out
}

// amqpChannel opens a channel on a connection of the test's own to the RabbitMQ at url, closed
// when the test ends.
func amqpChannel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func amqpPublisher(t testing.TB, url string) *amqpbackend.Publisher {
	t.Helper()
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newRelay(t testing.TB, db testDB, pub message.Publisher, tune ...func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	cfg := forwarder.Config{
		Store:          db.Store(),
		Publisher:      pub,
		PollInterval:   100 * time.Millisecond,
		CircuitBackoff: forwarder.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2},
		Backoff:        forwarder.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2},
	}
	for _, fn := range tune {
		fn(&cfg)
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// assertPerKeyOrder checks that each key's messages first arrived in increasing outbox seq order.
// A duplicate of a message already seen (after a crash, say) is not an inversion.
func assertPerKeyOrder(t testing.TB, got []testenv.Delivery) {
	t.Helper()
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d.UUID] {
			continue
		}
		seen[d.UUID] = true
		key := d.Headers[outboxkit.MetadataPartitionKey]
		seq, err := strconv.ParseInt(d.Headers[outboxkit.MetadataSeq], 10, 64)
		if err != nil {
			t.Fatalf("delivery %s has no seq header", d.UUID)
		}
		if seq < last[key] {
			t.Fatalf("key %s: seq %d arrived after seq %d", key, seq, last[key])
		}
		last[key] = seq
	}
}

// countByUUID counts deliveries per message UUID.
func countByUUID(got []testenv.Delivery) map[string]int {
	out := map[string]int{}
	for _, d := range got {
		out[d.UUID]++
	}
	return out
}

// faultyPublisher wraps a publisher to provoke faults around each publish.
type faultyPublisher struct {
	inner  message.Publisher
	before func(msg *message.Message) error // an error here is returned instead of publishing
	after  func(msg *message.Message)       // runs after a successful publish
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.before != nil {
			if err := p.before(m); err != nil {
				return err
			}
		}
		if err := p.inner.Publish(topic, m); err != nil {
			return err
		}
		if p.after != nil {
			p.after(m)
		}
	}
	return nil
}

func (p *faultyPublisher) Close() error { return nil }

// metricValue sums the samples of a metric family in reg whose labels include want.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

// pgStore is outboxkit's store in schema on pool, for a helper process attached to its parent's schema.
func pgStore(t testing.TB, pool *pgxpool.Pool, schema string) *pgxstore.Store {
	t.Helper()
	s, err := pgxstore.New(pool, pgxstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
