package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// drainRates are one drain's rates: from the start of the relays, and from the first event at the
// broker (what the relays' start costs is the difference).
type drainRates struct {
	fromStart, fromFirst float64
	// firstAfter and everyAfter are the times from the start to the first event at the broker and
	// to the first event of the last tenant; opened counts the sessions opened to the database.
	firstAfter, everyAfter time.Duration
	opened                 int64
}

// drain times --fleet-drain-tenants tenants, their outboxes preloaded with --events in all, drained
// to RabbitMQ by one fleet member and by a stock forwarder per tenant in this process, rounds
// alternating.
func (b *fleetBench) drain(ctx context.Context) ([]series, error) {
	c := b.c
	tenants := b.tenants[:c.fleetDrainTenants]
	fmt.Printf("  drain: %d tenants, %d events in all (%d each) over %d keys a tenant, preloaded, → RabbitMQ with confirms (one publisher for all)\n",
		len(tenants), c.events, c.events/len(tenants), c.keys)
	fmt.Printf("    fleet member: fleetstores.Opener (one handle of up to %d connections), tick %s; stock forwarders: store.Open each (MaxConns 1, poll-only:\n"+
		"      a LISTEN connection each would be %d more sessions, and a backlog drains without wake-ups); both: batch %s, in flight %s, published rows kept\n",
		store.DefaultMaxConns, fleet.DefaultTick, len(tenants), orDefault(c.batch, forwarder.DefaultBatchSize), orDefault(c.inFlight, forwarder.DefaultMaxInFlight))
	member := series{Name: fmt.Sprintf("fleet drain: member of %d tenants, from start", len(tenants)), Unit: "msg/s"}
	memberFirst := series{Name: fmt.Sprintf("fleet drain: member of %d tenants, from the first arrival", len(tenants)), Unit: "msg/s"}
	stock := series{Name: fmt.Sprintf("fleet drain: %d stock forwarders, from start", len(tenants)), Unit: "msg/s"}
	stockFirst := series{Name: fmt.Sprintf("fleet drain: %d stock forwarders, from the first arrival", len(tenants)), Unit: "msg/s"}
	for rep := 1; rep <= c.reps; rep++ {
		m, err := b.drainOnce(ctx, rep, tenants, b.drainMember)
		if err != nil {
			return nil, fmt.Errorf("fleet member drain: %w", err)
		}
		member.add(m.fromStart)
		memberFirst.add(m.fromFirst)
		s, err := b.drainOnce(ctx, rep, tenants, b.drainForwarders)
		if err != nil {
			return nil, fmt.Errorf("stock forwarders drain: %w", err)
		}
		stock.add(s.fromStart)
		stockFirst.add(s.fromFirst)
		fmt.Printf("  round %d: member %.0f msg/s (%.0f from the first arrival), stock forwarders %.0f (%.0f)\n", rep, m.fromStart, m.fromFirst, s.fromStart, s.fromFirst)
		fmt.Printf("    first event at the broker after %.0f ms / %.0f ms, every tenant's after %.0f ms / %.0f ms; sessions opened %d / %d\n",
			ms(m.firstAfter), ms(s.firstAfter), ms(m.everyAfter), ms(s.everyAfter), m.opened, s.opened)
	}
	ratios := []series{
		ratio("fleet drain: member ÷ stock forwarders, from start", member, stock),
		ratio("fleet drain: member ÷ stock forwarders, from the first arrival", memberFirst, stockFirst),
	}
	fmt.Print(table("drain rate", []series{member, memberFirst, stock, stockFirst}))
	fmt.Print(table("drain: ratios, paired by round", ratios))
	return append([]series{member, memberFirst, stock, stockFirst}, ratios...), nil
}

func orDefault(v, def int) string {
	if v == 0 {
		return fmt.Sprintf("%d (default)", def)
	}
	return fmt.Sprint(v)
}

// drainRelays builds what drains tenants, relaying through pub, named app in pg_stat_activity:
// the functions that run it, and what to close once they returned.
type drainRelays func(ctx context.Context, tenants []string, pub message.Publisher, app string) (runs []func(context.Context) error, closers []func() error, err error)

// drainOnce preloads the tenants' outboxes and times relays draining them to the broker.
func (b *fleetBench) drainOnce(ctx context.Context, rep int, tenants []string, relays drainRelays) (drainRates, error) {
	c := b.c
	id := fmt.Sprintf("r%d-%d-%s", rep, time.Now().UnixNano()%1e9, b.tag)
	topic := "bench.fleet.drain." + id
	if err := b.truncate(ctx, tenants); err != nil {
		return drainRates{}, err
	}
	if err := b.preload(ctx, tenants, topic); err != nil {
		return drainRates{}, err
	}
	arr, err := newArrivals(c.brokerURL, topic, c.events)
	if err != nil {
		return drainRates{}, err
	}
	defer arr.close()
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
	if err != nil {
		return drainRates{}, err
	}
	defer pub.Close()
	// The publisher declares the topic's exchange at its first publish: done here, untimed, or a
	// first publish from each of many relays at once would each open a channel to declare it.
	if err := pub.Publish(topic, pipeline.NewEvent("Warm", warmKey, []byte(`{}`))); err != nil {
		return drainRates{}, err
	}
	runs, closers, err := relays(ctx, tenants, pub, "outboxkit-bench-fleet-drain-"+id)
	defer func() {
		for _, cl := range closers {
			_ = cl()
		}
	}()
	if err != nil {
		return drainRates{}, err
	}
	var first, last time.Time
	_, opened0, err := b.databaseStats(ctx)
	if err != nil {
		return drainRates{}, err
	}
	start := time.Now() // a moment before timedDrain's clock
	fromStart, err := timedDrain{events: c.events, run: runs, arrived: func() (err error) {
		first, last, err = arr.wait(ctx, 5*time.Minute)
		return err
	}}.rate(ctx)
	if err != nil {
		return drainRates{}, err
	}
	if !last.After(first) {
		return drainRates{}, errors.New("every event arrived at once: too few to time")
	}
	_, opened1, err := b.databaseStats(ctx)
	if err != nil {
		return drainRates{}, err
	}
	return drainRates{fromStart: fromStart, fromFirst: rate(c.events, last.Sub(first)), firstAfter: first.Sub(start),
		everyAfter: arr.everyTenant().Sub(start), opened: opened1 - opened0}, nil
}

// preload writes the drain's events, spread evenly over tenants, a transaction of up to 1,000 a
// tenant at a time, waking nobody. Keys are a tenant's own, so that per-key order is checked for
// each.
func (b *fleetBench) preload(ctx context.Context, tenants []string, topic string) error {
	c := b.c
	for i, t := range tenants {
		n := c.events / len(tenants)
		if i < c.events%len(tenants) {
			n++
		}
		st := storeIn(b.pool, t, quietRows)
		for start := 0; start < n; start += 1000 {
			var msgs []*message.Message
			for j := start; j < min(start+1000, n); j++ {
				body, key := payload(j, c.keys)
				msgs = append(msgs, pipeline.NewEvent("OrderPlaced", t+"-"+key, body))
			}
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				return err
			}
			p, err := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
			if err == nil {
				err = p.Publish(topic, msgs...)
			}
			if err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// drainMember is one fleet member relaying tenants, with the fleet's defaults but for the drain's
// forwarder settings (drainRelay's).
func (b *fleetBench) drainMember(ctx context.Context, tenants []string, pub message.Publisher, app string) ([]func(context.Context) error, []func() error, error) {
	url := b.appURL(app)
	coord, err := store.Open(ctx, url, store.OpenOptions{Schema: fleetCoordSchema, PollOnly: true})
	if err != nil {
		return nil, nil, err
	}
	closers := []func() error{coord.Close}
	var catalog fleet.Outboxes
	for _, t := range tenants {
		catalog = append(catalog, fleet.Outbox{Name: t, URL: url, Schema: t})
	}
	m, err := fleet.New(fleet.Config{Fleet: "bench-" + app, Coordination: coord, Catalog: catalog, Open: fleetstores.Opener(), Publisher: pub,
		Forwarder: forwarder.Config{BatchSize: b.c.batch, MaxInFlight: b.c.inFlight, Retention: forwarder.Retention{Keep: true}}})
	if err != nil {
		return nil, closers, err
	}
	return []func(context.Context) error{m.Run}, closers, nil
}

// drainForwarders is a stock forwarder per tenant, each on a store of its own (one connection).
func (b *fleetBench) drainForwarders(ctx context.Context, tenants []string, pub message.Publisher, app string) ([]func(context.Context) error, []func() error, error) {
	var (
		runs    []func(context.Context) error
		closers []func() error
	)
	for _, t := range tenants {
		db, err := store.Open(ctx, b.appURL(app), store.OpenOptions{Schema: t, MaxConns: 1, PollOnly: true})
		if err != nil {
			return nil, closers, err
		}
		closers = append(closers, db.Close)
		f, err := drainRelay(b.c, db, pub, "bench")
		if err != nil {
			return nil, closers, err
		}
		runs = append(runs, f.Run)
	}
	return runs, closers, nil
}
