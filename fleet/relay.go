package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

// stopped is the deadline of a relay told to stop: its publisher refuses at once.
const stopped = math.MinInt64

// relay is an outbox the member holds a lease on: the goroutines that open its store and run its
// forwarder, and the watchdog that stops them when the lease is not renewed in time.
type relay struct {
	m      *Member
	outbox Outbox
	lease  store.Lease
	// fallback: the member took the outbox though another is its preferred owner (that one did
	// not take it); hold is how many ticks it keeps it before handing it back.
	fallback     bool
	acquiredTick int
	hold         int

	// deadline is when publishing stops (Member.since), unless a renewal moves it: the last
	// successful renewal's send time + LeaseTTL - StopBefore; stopped once told to stop.
	deadline atomic.Int64
	extended chan struct{}

	stopOnce sync.Once
	stopCh   chan struct{}
	// Set before stopCh closes.
	reason  string
	release bool

	mu       sync.Mutex
	errText  string             // the last failure to open or relay, "" once relaying
	stats    *store.OutboxStats // the last backlog reading
	statsAt  time.Time          // when it was read (local clock)
	statsSeq int                // counts readings and failures, so the member records each once
}

func newRelay(m *Member, o Outbox, l store.Lease, deadline time.Duration) *relay {
	r := &relay{m: m, outbox: o, lease: l, extended: make(chan struct{}, 1), stopCh: make(chan struct{})}
	r.deadline.Store(int64(deadline))
	return r
}

func (r *relay) fields() watermill.LogFields {
	return watermill.LogFields{"fleet": r.m.cfg.Fleet, "member": r.m.cfg.Member, "outbox": r.outbox.Name, "token": r.lease.Token}
}

// allowed reports whether the lease is still certainly held: the member's clock is before the
// deadline its last renewal set.
func (r *relay) allowed() bool { return int64(r.m.since()) < r.deadline.Load() }

// extend moves the deadline to d after a renewal sent at d-(LeaseTTL-StopBefore) succeeded. It
// does nothing to a relay told to stop.
func (r *relay) extend(d time.Duration) {
	for {
		cur := r.deadline.Load()
		if cur == stopped || int64(d) <= cur {
			return
		}
		if r.deadline.CompareAndSwap(cur, int64(d)) {
			break
		}
	}
	select {
	case r.extended <- struct{}{}:
	default:
	}
}

// stop tells the relay to stop publishing at once and to end; release frees the lease once the
// forwarder has stopped. The first call decides.
func (r *relay) stop(reason string, release bool) {
	r.stopOnce.Do(func() {
		r.deadline.Store(stopped)
		r.reason, r.release = reason, release
		close(r.stopCh)
	})
}

func (r *relay) stopping() bool {
	select {
	case <-r.stopCh:
		return true
	default:
		return false
	}
}

// run relays the outbox until the relay is told to stop or its lease runs out, then ends: its
// forwarder stopped, its store closed, its lease freed when it was released. base carries no
// cancellation: only stop ends a relay.
func (r *relay) run(base context.Context) {
	defer r.m.relays.Done()
	ctx, cancel := context.WithCancel(base)
	work := make(chan struct{})
	go func() {
		defer close(work)
		r.work(ctx)
	}()
	r.watch()
	cancel()
	<-work
	r.m.ended(r)
}

// watch waits for stop, or for the deadline to pass without a renewal: then the lease may
// expire before the next renewal could land, and another member may acquire the outbox. It
// returns once stopCh is closed, so that what stop set is visible to its caller.
func (r *relay) watch() {
	defer func() { <-r.stopCh }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d := r.deadline.Load()
		if d == stopped {
			return
		}
		if left := time.Duration(d) - r.m.since(); left <= 0 {
			r.m.cfg.Logger.Error("Lease not renewed in time: the outbox's relay stops before another member can acquire it",
				errLeaseOverdue, r.fields())
			r.m.cfg.Metrics.LeaseLost(r.outbox.Name, "not renewed in time")
			r.stop("lease not renewed in time", false)
			return
		}
		timer.Reset(time.Duration(d) - r.m.since())
		select {
		case <-r.stopCh:
			return
		case <-r.extended:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

var errLeaseOverdue = errors.New("no renewal of the lease succeeded in LeaseTTL-StopBefore")

// relayBackoff spaces the attempts to open an outbox's store or to run its relay after a failure.
func (r *relay) backoff(attempt int) time.Duration {
	return outboxkit.Backoff{Initial: r.m.cfg.Tick, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2}.Delay(attempt)
}

// work opens the outbox's store and runs its forwarder until ctx ends, trying again after a
// pause when either fails.
func (r *relay) work(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := r.open(ctx)
		if ctx.Err() != nil {
			return
		}
		r.failed(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.backoff(attempt)):
		}
	}
}

// open opens the store and relays it; it returns when ctx ends (nil) or the relay cannot go on.
func (r *relay) open(ctx context.Context) error {
	opened, err := r.m.cfg.Open(ctx, r.outbox)
	if err == nil && opened.Store == nil {
		err = errors.New("the Opener returned no Store")
		if opened.Close != nil {
			_ = opened.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("open the outbox's store: %w", err)
	}
	defer func() {
		if opened.Close != nil {
			if err := opened.Close(); err != nil {
				r.m.cfg.Logger.Error("Cannot close the outbox's store", err, r.fields())
			}
		}
	}()
	f, err := forwarder.New(r.m.forwarderConfig(r, opened.Store))
	if err != nil {
		return err
	}
	run := opened.Run
	if run == nil {
		run = func(ctx context.Context, f *forwarder.Forwarder) error { return f.Run(ctx) }
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.readStats(ctx, f)
	}()
	r.m.cfg.Logger.Info("Relaying outbox", r.fields())
	err = run(ctx, f)
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("the relay returned before it was stopped")
	}
	return fmt.Errorf("relay: %w", err)
}

func (r *relay) failed(err error) {
	r.m.cfg.Logger.Error("Outbox relay failed; trying again", err, r.fields())
	r.m.cfg.Metrics.RelayFailed(r.outbox.Name, err)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errText = err.Error()
	r.statsAt = time.Now()
	r.statsSeq++
}

// readStats reads the outbox's backlog now and then, for Status.
func (r *relay) readStats(ctx context.Context, f *forwarder.Forwarder) {
	every := r.m.statsInterval()
	timer := time.NewTimer(r.m.cfg.Tick)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sctx, cancel := context.WithTimeout(ctx, every)
		st, err := f.Stats(sctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.statsAt, r.statsSeq = time.Now(), r.statsSeq+1
		if err != nil {
			r.errText = "read the backlog: " + err.Error()
		} else {
			r.errText, r.stats = "", &st
		}
		r.mu.Unlock()
		timer.Reset(every)
	}
}

// record is what the member records of the outbox in the coordination database: its backlog
// and error when they changed since seq.
func (r *relay) record(o *store.FleetOutbox, seq int, dbOffset time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statsSeq == seq {
		return seq
	}
	o.StatsAt = r.statsAt.Add(dbOffset)
	o.Error = r.errText
	if r.stats != nil {
		o.Pending, o.OldestPendingAge = int64(r.stats.Pending), r.stats.OldestPendingAge
	}
	return r.statsSeq
}
