package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/pipeline"
)

// binlogLatencyWriters is how many writers offer binlogLatency's events, as the log scenario's
// end-to-end writers (e2eOffer).
const binlogLatencyWriters = 16

// binlogLatencyResult is one timed run at a fixed offered rate.
type binlogLatencyResult struct {
	published []time.Duration // COMMIT returned → the relay's publish confirmed, per event
	delivered []time.Duration // COMMIT returned → delivered to a raw consumer, per event
	missing   int             // events not published when the run gave up
	written   float64         // events/s the writers committed
	stmts     stmtRates       // the relay's statements per timed event, the writers' taken out
}

// binlogLatency offers events at 1,000 msg/s for --e2e-for, each in its own business transaction
// (an order row and its event) from 16 writers on a fixed schedule (open loop: a slow relay does
// not slow the offer down), to the polling relay and to the binlog relay in turn, each round: the
// time from each writer's COMMIT returned to the relay's publish confirmed by RabbitMQ, and to its
// delivery to a raw consumer of a queue bound to the topic; and the relay's statements per event
// meanwhile, less the writers' (measured first with no relay running).
func binlogLatency(ctx context.Context, c config, s *binlogServer) ([]series, error) {
	const at = 1000
	fmt.Printf("\nbinlog, latency: COMMIT returned → publish confirmed by RabbitMQ (and → delivered to a raw consumer), %d msg/s offered by %d writers, "+
		"an event a transaction with an order row, %s a run, %d reps\n", at, binlogLatencyWriters, c.e2eFor, c.reps)
	writers, err := binlogLatencyWritersAlone(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("writers alone: %w", err)
	}
	fmt.Printf("  writers alone, no relay: %.4f statements/event (%s)\n", writers.total(), writers.kinds())
	modes := []struct{ mode, name string }{{"poll", "polling relay"}, {"binlog", "binlog relay"}}
	type figs struct{ p50, p95, p99, max, d50, d99, written, stmts series }
	by := make([]figs, len(modes))
	for i, m := range modes {
		name := fmt.Sprintf("%s at %d msg/s", m.name, at)
		by[i] = figs{p50: series{Name: name + ", published p50", Unit: "ms"}, p95: series{Name: name + ", published p95", Unit: "ms"},
			p99: series{Name: name + ", published p99", Unit: "ms"}, max: series{Name: name + ", published max", Unit: "ms"},
			d50: series{Name: name + ", delivered to a raw consumer, p50", Unit: "ms"}, d99: series{Name: name + ", delivered to a raw consumer, p99", Unit: "ms"},
			written: series{Name: name + ", written", Unit: "msg/s"}, stmts: series{Name: name + ", relay statements/event", Unit: ""}}
	}
	for rep := 1; rep <= c.reps; rep++ {
		for i, m := range modes {
			res, err := binlogLatencyOnce(ctx, c, s, m.mode, rep, at, c.e2eFor, writers)
			if err != nil {
				return nil, fmt.Errorf("%s at %d msg/s: %w", m.name, at, err)
			}
			f := &by[i]
			f.p50.add(ms(percentile(res.published, 50)))
			f.p95.add(ms(percentile(res.published, 95)))
			f.p99.add(ms(percentile(res.published, 99)))
			f.max.add(ms(percentile(res.published, 100)))
			f.d50.add(ms(percentile(res.delivered, 50)))
			f.d99.add(ms(percentile(res.delivered, 99)))
			f.written.add(res.written)
			f.stmts.add(res.stmts.total())
			note := ""
			if res.missing > 0 {
				note = fmt.Sprintf(" (%d events still not published when the run gave up)", res.missing)
			}
			fmt.Printf("  round %d: %s (written %.0f/s): published p50 %.1f ms, p99 %.1f ms, max %.1f ms; delivered p50 %.1f ms, p99 %.1f ms; "+
				"relay statements %.4f/event (%s)%s\n", rep, m.name, res.written, ms(percentile(res.published, 50)), ms(percentile(res.published, 99)),
				ms(percentile(res.published, 100)), ms(percentile(res.delivered, 50)), ms(percentile(res.delivered, 99)),
				res.stmts.total(), res.stmts.kinds(), note)
		}
	}
	var rows []series
	for _, f := range by {
		rows = append(rows, f.p50, f.p95, f.p99, f.max, f.d50, f.d99, f.written, f.stmts)
	}
	ratios := []series{
		ratio("binlog p50 / polling p50", by[1].p50, by[0].p50),
		ratio("binlog p99 / polling p99", by[1].p99, by[0].p99),
	}
	fmt.Print(table("binlog relay, commit → publish latency", rows))
	fmt.Print(table("binlog relay, commit → publish latency, paired by round", ratios))
	return append(rows, ratios...), nil
}

// binlogLatencyWritersAlone is the statements binlogLatency's writers send per event, with no
// relay running.
func binlogLatencyWritersAlone(ctx context.Context, s *binlogServer) (stmtRates, error) {
	o, drop, err := s.newOutbox(ctx, "bench_binlog_lat_writers", binlogLatencyWriters)
	if err != nil {
		return nil, err
	}
	defer drop()
	if err := o.createOrders(ctx, s); err != nil {
		return nil, err
	}
	const n = 500
	c0, err := s.counters(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := o.offer(ctx, "bench.binlog."+o.name, 0, n, 5000, &sync.Map{}); err != nil {
		return nil, err
	}
	c1, err := s.counters(ctx)
	if err != nil {
		return nil, err
	}
	return statements(c0, c1, s.oneRead, n), nil
}

func (o *binlogOutbox) createOrders(ctx context.Context, s *binlogServer) error {
	_, err := s.own.ExecContext(ctx, "CREATE TABLE `"+o.name+"`.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL)")
	return err
}

// binlogLatencyOnce runs one relay (mode "poll" or "binlog") at perSec for d, after an untimed
// warm-up of half a second's events.
func binlogLatencyOnce(ctx context.Context, c config, s *binlogServer, mode string, rep, perSec int, d time.Duration, writers stmtRates) (binlogLatencyResult, error) {
	var res binlogLatencyResult
	o, drop, err := s.newOutbox(ctx, fmt.Sprintf("bench_binlog_lat_%s_%d", mode, rep), binlogLatencyWriters)
	if err != nil {
		return res, err
	}
	defer drop()
	if err := o.createOrders(ctx, s); err != nil {
		return res, err
	}
	topic := "bench.binlog." + o.name
	dropExchange, err := declareExchange(c.brokerURL, topic)
	if err != nil {
		return res, err
	}
	defer dropExchange()
	var delivered sync.Map // uuid → delivered to the probe
	stopProbe, err := probeDeliveries(c.brokerURL, []string{topic}, &delivered)
	if err != nil {
		return res, err
	}
	defer stopProbe()
	amqpPub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
	if err != nil {
		return res, err
	}
	defer amqpPub.Close()
	pub := &stampPublisher{Publisher: amqpPub}
	relay, err := s.newRelay(ctx, c, o, mode, pub)
	if err != nil {
		return res, err
	}
	defer relay.db.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.run(runCtx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	defer func() { _ = stop() }()
	if err := started(relay.ready(), mode+" relay"); err != nil {
		return res, err
	}

	total := int(float64(perSec) * d.Seconds())
	warmN := max(50, perSec/2) // untimed: connections, channels, plans
	if _, err := o.offer(ctx, topic, 0, warmN, perSec, &sync.Map{}); err != nil {
		return res, err
	}
	if err := pub.waitFor(ctx, warmN, 60*time.Second); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	c0, err := s.counters(ctx)
	if err != nil {
		return res, err
	}
	var committed sync.Map // uuid → COMMIT returned
	took, err := o.offer(ctx, topic, warmN, total, perSec, &committed)
	if err != nil {
		return res, err
	}
	waitErr := pub.waitFor(ctx, warmN+total, 60*time.Second)
	c1, err := s.counters(ctx)
	if err != nil {
		return res, err
	}
	if err := stop(); err != nil {
		return res, err
	}
	res.written = rate(total, took)
	res.stmts = statements(c0, c1, s.oneRead, total, writers)
	// The deliveries follow the confirms by a moment.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n := 0
		committed.Range(func(uuid, _ any) bool {
			if _, ok := delivered.Load(uuid); ok {
				n++
			}
			return true
		})
		if n == total {
			break
		}
	}
	committed.Range(func(uuid, t0 any) bool {
		if t1, ok := pub.published.Load(uuid); ok {
			res.published = append(res.published, max(0, t1.(time.Time).Sub(t0.(time.Time))))
		}
		if t1, ok := delivered.Load(uuid); ok {
			res.delivered = append(res.delivered, max(0, t1.(time.Time).Sub(t0.(time.Time))))
		}
		return true
	})
	res.missing = total - len(res.published)
	if res.missing > 0 && waitErr != nil {
		fmt.Printf("  %s: %v\n", mode, waitErr)
	}
	return res, nil
}

// offer writes n events numbered from first, each in its own business transaction with an order
// row, on a fixed schedule at perSec (open loop), from binlogLatencyWriters writers, and records
// each one's COMMIT returned in committed. It returns how long the writing took.
func (o *binlogOutbox) offer(ctx context.Context, topic string, first, n, perSec int, committed *sync.Map) (time.Duration, error) {
	slots := make(chan int, n)
	var writeErr atomic.Value
	var wg sync.WaitGroup
	for range binlogLatencyWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range slots {
				body, key := payload(i, 200)
				msg := pipeline.NewEvent("OrderPlaced", key, body)
				if err := o.write(ctx, topic, []*message.Message{msg}, true); err != nil {
					writeErr.CompareAndSwap(nil, err)
					return
				}
				committed.Store(msg.UUID, time.Now())
			}
		}()
	}
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(float64(i) / float64(perSec) * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		slots <- first + i
	}
	close(slots)
	wg.Wait()
	if err, _ := writeErr.Load().(error); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// stampPublisher records when the broker confirmed each message (by UUID), the first time.
type stampPublisher struct {
	message.Publisher
	published sync.Map // uuid → confirmed
	n         atomic.Int64
}

func (p *stampPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	for _, m := range msgs {
		if _, again := p.published.LoadOrStore(m.UUID, now); !again {
			p.n.Add(1)
		}
	}
	return nil
}

// waitFor waits until n messages were confirmed, for at most within.
func (p *stampPublisher) waitFor(ctx context.Context, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for p.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d events published within %s", p.n.Load(), n, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// declareExchange declares topic's fanout exchange, as the relay's publisher does, so that a probe
// may bind to it before the first publish; drop deletes it.
func declareExchange(url, topic string) (drop func(), err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("declare exchange %s", topic), err)
	}
	return func() {
		if conn, err := amqp.Dial(url); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(topic, false, false)
			}
			_ = conn.Close()
		}
	}, nil
}
