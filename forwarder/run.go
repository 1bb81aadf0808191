package forwarder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// Run relays until ctx ends, then returns nil once every goroutine it started has stopped.
//
// It runs a pass when a writer wakes it (the store's Waker: Postgres NOTIFY on a connection of its
// own that reconnects by itself, SQLite's in-process signal), when the jittered PollInterval
// elapses (growing up to IdlePollInterval while passes find nothing), and back to back while
// passes come back full.
// Database and broker failures never end it: it logs them and backs off. What no outage explains
// ends it at once, with an error that says what to do: outboxkit's tables missing or migrated by a
// newer build, the database or the broker (when its publisher can check, as the backends' do)
// refusing the relay's credentials. Retention runs on its own timer. Run may not run at once with
// another Run or a RunSource on one Forwarder: it returns an error at once.
func (f *Forwarder) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer f.running.Store(false)
	if err := f.checkAtStart(ctx); err != nil {
		return err
	}
	release, err := f.claimTxnPublisher()
	if err != nil {
		return err
	}
	defer release()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	wake := make(chan struct{}, 1)
	var awaker store.Awaker
	if waker := f.cfg.Store.Waker(); waker == nil {
		f.markStarted()
	} else {
		if a, ok := waker.(store.Awaker); ok && !f.cfg.DisableAwake {
			awaker = a
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			waker.Listen(ctx, func() {
				select {
				case wake <- struct{}{}:
				default: // a wake-up is already pending: wake-ups are debounced
				}
			}, f.markStarted, func(err error) {
				f.cfg.Logger.Error("Outbox wake-up connection failed, reconnecting", err, watermill.LogFields{"forwarder": f.cfg.Name})
			})
		}()
	}
	if rc, ok := store.RelayControlOf(f.cfg.Store); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.heartbeatLoop(ctx, rc)
		}()
	}
	if !f.cfg.Retention.Keep && !f.cfg.Retention.DeleteOnPublish {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.pruneLoop(ctx)
		}()
	}

	f.cfg.Logger.Info("Forwarder running", watermill.LogFields{
		"forwarder": f.cfg.Name, "store": f.cfg.Store.Info().Name, "schema": f.cfg.Store.Info().Schema,
		"woken_by_writers": f.cfg.Store.Waker() != nil, "poll_interval": f.cfg.PollInterval,
	})
	dbFailures := 0
	var aw awakeState
	idleWait := f.cfg.PollInterval // the wait after the next empty pass (IdlePollInterval)
	var notBefore time.Time        // TransactionInterval: the next transactional pass starts no sooner
	for {
		if wait := time.Until(notBefore); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			timer.Stop()
		}
		probing := f.circuit.isOpen() // a pass of an open circuit publishes one row at most
		passStart := time.Now()
		res, err := f.DispatchBatch(ctx)
		notBefore = time.Time{}
		if f.txn.pub != nil && res.Published > 0 && res.Claimed < f.cfg.BatchSize {
			notBefore = passStart.Add(f.cfg.TransactionInterval)
		}
		if ctx.Err() != nil {
			f.cfg.Logger.Info("Forwarder stopped", watermill.LogFields{"forwarder": f.cfg.Name})
			return nil
		}
		var (
			wait     time.Duration
			wakeable = true
		)
		// Only passes that find nothing, one after another, slow the poll (IdlePollInterval).
		idle := idleWait
		idleWait = f.cfg.PollInterval
		switch {
		case err != nil && stopsRelay(err):
			f.cfg.Logger.Error("Forwarder stopped: another relay of its group took over, or the group is not this outbox's", err, watermill.LogFields{"forwarder": f.cfg.Name})
			return err
		case err != nil:
			dbFailures++
			wait = f.cfg.CircuitBackoff.Delay(dbFailures)
			f.cfg.Logger.Error("Outbox pass failed, retrying", err, watermill.LogFields{
				"forwarder": f.cfg.Name, "retry_in": wait,
			})
		case res.CircuitOpen:
			// The broker is down: a NOTIFY does not make it reachable, so only its next check counts.
			dbFailures = 0
			wait, wakeable = max(0, res.RetryAt.Sub(f.cfg.Now())), false
		case res.UnreachableErr != nil:
			dbFailures = 0
			wait = 0 // the next pass sees the open circuit and waits for the next check
		case probing && res.Published > 0:
			dbFailures = 0
			wait = 0 // the broker is back: the backlog behind the probe goes now
		case res.Claimed >= f.cfg.BatchSize:
			dbFailures = 0
			wait = 0 // more is probably waiting
			f.stayAwake(ctx, awaker, &aw, res.Claimed)
		default:
			dbFailures = 0
			wait = jittered(f.cfg.PollInterval, 0.1)
			if f.cfg.IdlePollInterval > 0 && res.Claimed == 0 {
				wait = jittered(idle, 0.1)
				idleWait = min(2*idle, f.cfg.IdlePollInterval)
			}
			if f.stayAwake(ctx, awaker, &aw, res.Claimed) {
				wait, idleWait = f.cfg.AwakePoll, f.cfg.PollInterval
			}
		}
		if wait == 0 {
			continue
		}
		timer := time.NewTimer(wait)
		if wakeable {
			select {
			case <-ctx.Done():
			case <-timer.C:
			case <-wake:
				idleWait = f.cfg.PollInterval
			}
		} else {
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		timer.Stop()
	}
}

// awakeState is what a relay has measured and told writers about being awake.
type awakeState struct {
	busy        bool      // rows come faster than AwakeAbove a second
	windowStart time.Time // the rate is measured over windows of a quarter second
	windowRows  int
	until       time.Time // as far as the relay knows, writers skip the wake-up until then
}

// stayAwake keeps the relay awake while it is busy: it measures the rate of the rows it claims,
// tells writers it is awake while the rate is above AwakeAbove (renewing AwakeFor before it runs
// out) and reports whether the relay should poll at AwakePoll instead of sleeping — also for a
// while after it stops being busy, until the writers it told have gone back to waking it, so that
// a row whose writer skipped the wake-up is not left for the next PollInterval.
func (f *Forwarder) stayAwake(ctx context.Context, a store.Awaker, s *awakeState, claimed int) bool {
	if a == nil {
		return false
	}
	now := f.cfg.Now()
	if s.windowStart.IsZero() {
		s.windowStart = now
	}
	s.windowRows += claimed
	if elapsed := now.Sub(s.windowStart); elapsed >= 250*time.Millisecond {
		s.busy = float64(s.windowRows)/elapsed.Seconds() > float64(f.cfg.AwakeAbove)
		s.windowStart, s.windowRows = now, 0
	}
	busy := s.busy && claimed > 0
	if busy && s.until.Sub(now) < f.cfg.AwakeFor/2 {
		if err := a.Awake(ctx, f.cfg.AwakeFor); err != nil {
			f.cfg.Logger.Error("Cannot tell writers the relay is awake", err, watermill.LogFields{"forwarder": f.cfg.Name})
			return false
		}
		s.until = now.Add(f.cfg.AwakeFor)
	}
	// Until the last writer told has committed: AwakeFor, and a margin for its transaction.
	return busy || now.Before(s.until.Add(50*time.Millisecond))
}

// checker is a publisher that can tell, before it publishes, whether the broker accepts it.
type checker interface {
	Check(ctx context.Context) error
}

// checkAtStart refuses to start on a misconfiguration (missing or newer tables, refused
// credentials); an unreachable database or broker is only logged: the relay starts, and waits.
func (f *Forwarder) checkAtStart(ctx context.Context) error {
	fields := watermill.LogFields{"forwarder": f.cfg.Name}
	cctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	if err := f.cfg.Store.CheckSchema(cctx); err != nil {
		if errors.Is(err, store.ErrNotMigrated) || errors.Is(err, store.ErrNewerSchema) || outboxkit.IsAccessDenied(err) {
			return fmt.Errorf("forwarder %s: %w", f.cfg.Name, err)
		}
		f.cfg.Logger.Error("Cannot check the outbox's tables at start; the relay starts and retries", err, fields)
	}
	if c, ok := f.cfg.Publisher.(checker); ok {
		if err := c.Check(cctx); err != nil {
			if outboxkit.IsAccessDenied(err) {
				return fmt.Errorf("forwarder %s: the broker refuses the relay: %w", f.cfg.Name, err)
			}
			f.cfg.Logger.Error("Broker unreachable at start; the relay starts and waits for it", err, fields)
		}
	}
	return nil
}

// Running is closed once the first Run is relaying and, where the store's writers wake relays,
// listening for them — from then on a commit wakes it.
func (f *Forwarder) Running() <-chan struct{} { return f.started }

func (f *Forwarder) markStarted() { f.startedOnce.Do(func() { close(f.started) }) }

func (f *Forwarder) pruneLoop(ctx context.Context) {
	ticker := time.NewTicker(f.cfg.Retention.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		n, err := f.PrunePublished(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			f.cfg.Logger.Error("Outbox retention failed", err, watermill.LogFields{"forwarder": f.cfg.Name})
		case n > 0:
			f.cfg.Logger.Debug("Outbox retention deleted published rows", watermill.LogFields{
				"forwarder": f.cfg.Name, "rows": n,
			})
		}
	}
}
