package forwarder

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
)

// Run relays until ctx ends, then returns nil once every goroutine it started has stopped.
//
// It runs a pass when a writer's NOTIFY arrives (on a dedicated connection that reconnects by
// itself), when the jittered PollInterval elapses, and back to back while passes come back full.
// Database and broker failures never end it: it logs them and backs off. Retention runs on its own
// timer. Run may not be called twice at once on one Forwarder.
func (f *Forwarder) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer f.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	wake := make(chan struct{}, 1)
	if f.cfg.PollOnly {
		f.markStarted()
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.listen(ctx, wake)
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
		"forwarder": f.cfg.Name, "schema": string(f.schema), "poll_only": f.cfg.PollOnly,
	})
	dbFailures := 0
	for {
		res, err := f.DispatchBatch(ctx)
		if ctx.Err() != nil {
			f.cfg.Logger.Info("Forwarder stopped", watermill.LogFields{"forwarder": f.cfg.Name})
			return nil
		}
		var (
			wait     time.Duration
			wakeable = true
		)
		switch {
		case err != nil:
			dbFailures++
			wait = f.cfg.CircuitBackoff.Delay(dbFailures)
			f.cfg.Logger.Error("Outbox pass failed, retrying", err, watermill.LogFields{
				"forwarder": f.cfg.Name, "retry_in": wait,
			})
		case res.CircuitOpen:
			// The broker is down: a NOTIFY does not make it reachable, so only the probe time counts.
			dbFailures = 0
			wait, wakeable = max(0, res.RetryAt.Sub(f.cfg.Now())), false
		case res.TransportErr != nil:
			dbFailures = 0
			wait = 0 // the next pass sees the open circuit and waits for the probe time
		case res.Claimed >= f.cfg.BatchSize:
			dbFailures = 0
			wait = 0 // more is probably waiting
		default:
			dbFailures = 0
			wait = jittered(f.cfg.PollInterval, 0.1)
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

// Running is closed once the first Run is relaying and, unless PollOnly is set, listening for
// writers' notifications — from then on a commit wakes it.
func (f *Forwarder) Running() <-chan struct{} { return f.started }

func (f *Forwarder) markStarted() { f.startedOnce.Do(func() { close(f.started) }) }

// listen holds the LISTEN connection until ctx ends. pgxlisten reconnects after failures; on every
// (re)connect a pass is triggered, since notifications sent while disconnected are lost.
func (f *Forwarder) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending: notifications are debounced
		}
	}
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cfg := f.cfg.Pool.Config().ConnConfig.Copy()
			if cfg.RuntimeParams == nil {
				cfg.RuntimeParams = map[string]string{}
			}
			// Named after the pool's connections so operators can tell whose it is.
			cfg.RuntimeParams["application_name"] = strings.TrimPrefix(cfg.RuntimeParams["application_name"]+"-listen", "-")
			if cfg.RuntimeParams["application_name"] == "listen" {
				cfg.RuntimeParams["application_name"] = "outboxkit-forwarder-listen"
			}
			return pgx.ConnectConfig(ctx, cfg)
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				f.cfg.Logger.Error("Outbox LISTEN connection failed, reconnecting", err,
					watermill.LogFields{"forwarder": f.cfg.Name, "retry_in": f.cfg.ListenRetry})
			}
		},
		ReconnectDelay: f.cfg.ListenRetry,
	}
	l.Handle(f.schema.NotifyChannel(), wakeHandler{
		onNotify: signal,
		onListen: func() {
			f.markStarted()
			signal()
		},
	})
	_ = l.Listen(ctx) // returns only when ctx ends
}

// wakeHandler turns notifications into wake-ups. As a pgxlisten.BacklogHandler it learns when
// LISTEN has been issued on a new connection.
type wakeHandler struct {
	onNotify func()
	onListen func()
}

func (h wakeHandler) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	h.onNotify()
	return nil
}

func (h wakeHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.onListen()
	return nil
}

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
