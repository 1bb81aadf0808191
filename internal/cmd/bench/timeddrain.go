package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// timedDrain is the skeleton every drain rate is timed by (forwarders, log relays, stock
// Watermill's forwarder, consumers): what drains starts with the clock and stops before the rate
// is returned, so that no scenario counts its start or its stop differently from another.
type timedDrain struct {
	events int
	run    []func(context.Context) error // what drains, each until its context ends
	// stop, when set, is called once the context has ended, for what does not return from run on
	// its context alone (Watermill's forwarder: its router is closed).
	stop func()
	// arrived returns once all events are where the scenario counts them, or why they are not.
	arrived func() error
	// atRest, when set, runs after arrived, what drains still running: a relay's idle figures.
	atRest func() error
}

// rate runs the drain and returns events per second. An error from run fails the drain: a relay
// that failed did not measure what it was meant to.
func (d timedDrain) rate(ctx context.Context) (float64, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(d.run))
	start := time.Now()
	for i, run := range d.run {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run(runCtx) }()
	}
	halt := func() {
		cancel()
		if d.stop != nil {
			d.stop()
		}
		wg.Wait()
	}
	if err := d.arrived(); err != nil {
		halt()
		return 0, err
	}
	r := rate(d.events, time.Since(start))
	if d.atRest != nil {
		if err := d.atRest(); err != nil {
			halt()
			return 0, err
		}
	}
	halt()
	return r, errors.Join(errs...)
}

// waitFor waits until done is closed, for at most within; short says what had arrived by then.
func waitFor(ctx context.Context, done <-chan struct{}, within time.Duration, short func() error) error {
	select {
	case <-done:
		return nil
	case <-time.After(within):
		return short()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// preloadEvents hands publish c.events events over c.keys keys, 1,000 at a time: the backlog
// every drain starts from.
func preloadEvents(c config, publish func(msgs []*message.Message) error) error {
	for start := 0; start < c.events; start += 1000 {
		var msgs []*message.Message
		for i := start; i < min(start+1000, c.events); i++ {
			body, key := payload(i, c.keys)
			msgs = append(msgs, pipeline.NewEvent("OrderPlaced", key, body))
		}
		if err := publish(msgs); err != nil {
			return err
		}
	}
	return nil
}

// drainRelay is the forwarder a drain times: --batch and --inflight, and published rows kept, so
// that retention's deletes are not part of the rate.
func drainRelay(c config, st store.Store, pub message.Publisher, name string) (*forwarder.Forwarder, error) {
	return forwarder.New(forwarder.Config{Store: st, Publisher: pub, Name: name,
		BatchSize: c.batch, MaxInFlight: c.inFlight, Retention: forwarder.Retention{Keep: true}})
}

// countingPublisher counts the messages the broker accepted and says when n were.
type countingPublisher struct {
	message.Publisher
	n    int64
	got  atomic.Int64
	once sync.Once
	done chan struct{}
}

func newCountingPublisher(pub message.Publisher, n int) *countingPublisher {
	return &countingPublisher{Publisher: pub, n: int64(n), done: make(chan struct{})}
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.got.Add(int64(len(msgs))) >= p.n {
		p.once.Do(func() { close(p.done) })
	}
	return nil
}

// wait waits until the broker accepted all n, for at most within.
func (p *countingPublisher) wait(ctx context.Context, within time.Duration) error {
	return waitFor(ctx, p.done, within, func() error {
		return fmt.Errorf("only %d of %d events published within %s", p.got.Load(), p.n, within)
	})
}

// drainMarked times one forwarder draining st through pub: over once published says every event
// is out and st holds no pending row (published is not drained until the rows are marked).
func drainMarked(ctx context.Context, c config, st store.Store, pub message.Publisher, published func() error) (float64, error) {
	relay, err := drainRelay(c, st, pub, "bench")
	if err != nil {
		return 0, err
	}
	return timedDrain{events: c.events, run: []func(context.Context) error{relay.Run}, arrived: func() error {
		if err := published(); err != nil {
			return err
		}
		return drained(ctx, st)
	}}.rate(ctx)
}

// drained waits until st holds no pending row.
func drained(ctx context.Context, st store.Store) error {
	for {
		s, err := st.OutboxStats(ctx, time.Now())
		if err != nil {
			return err
		}
		if s.Pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
