package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Fault kinds, as the failure matrix names them.
const (
	faultKillRelay      = "SIGKILL a forwarder, restart it"
	faultKillConsumer   = "SIGKILL a consumer process, restart it"
	faultKillOrders     = "SIGKILL the order service, restart it"
	faultBrokerConns    = "close the soak's broker connections"
	faultBrokerRestart  = "stop and start the RabbitMQ application"
	faultDBSessions     = "terminate the soak's database sessions"
	faultPublishNoMark  = "forwarder pass dies after publish, before mark"
	faultTxnOpen        = "txn relay killed with its transaction open"
	faultTxnCommitted   = "txn relay killed after its commit, before mark"
	faultTxnFenced      = "txn relay fenced by another of its group"
	faultChargeNoCommit = "Billing dies after its charge, before commit"
	faultPoison         = "poisoned event (no consumer can decode it)"
	faultRepeat         = "POST repeated with its Idempotency-Key"
	faultRetry          = "unanswered POST retried with its key"
)

// injector provokes the faults at random moments.
type injector struct {
	e        *env
	rnd      *rand.Rand
	relays   []*proc
	consumer []*proc
	orders   *proc
	admin    *sql.DB
	log      func(format string, args ...any)

	mu     sync.Mutex
	counts map[string]int
	errors []string
}

func (in *injector) kinds() []string {
	k := []string{faultKillRelay, faultKillConsumer, faultKillOrders, faultBrokerConns}
	if in.e.o.store != "sqlite" {
		k = append(k, faultDBSessions)
	}
	if in.e.o.brokerRestart {
		k = append(k, faultBrokerRestart)
	}
	return k
}

// run injects a fault every o.faultEvery on average (exponentially spaced) until ctx ends.
func (in *injector) run(ctx context.Context) {
	kinds := in.kinds()
	for {
		wait := time.Duration(-math.Log(1-in.rnd.Float64()) * float64(in.e.o.faultEvery))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		kind := kinds[in.rnd.IntN(len(kinds))]
		what, err := in.inject(ctx, kind)
		if errors.Is(err, errDown) { // not a fault: the process is already down, its restart pending
			in.log("fault %-45s skipped: %s", kind, what)
			continue
		}
		in.mu.Lock()
		if err != nil {
			in.errors = append(in.errors, fmt.Sprintf("%s: %v", kind, err))
		} else {
			in.counts[kind]++
		}
		in.mu.Unlock()
		if err != nil {
			in.log("fault %-45s FAILED TO INJECT: %v", kind, err)
		} else {
			in.log("fault %-45s %s", kind, what)
		}
	}
}

// errDown is a kill that found its process down already, its restart pending: nothing is
// injected and nothing counted (a relay killed at its own fault point, or by the soak a moment
// before, would otherwise be counted as killed twice).
var errDown = errors.New("down already")

func (in *injector) kill(p *proc) (string, error) {
	if !p.kill() {
		return p.name + " is down already, its restart pending: nothing killed", errDown
	}
	return p.name, nil
}

func (in *injector) inject(ctx context.Context, kind string) (string, error) {
	// A fault begun just before the load ends is carried out whole (each step is bounded).
	ctx = context.WithoutCancel(ctx)
	switch kind {
	case faultKillRelay:
		return in.kill(in.relays[in.rnd.IntN(len(in.relays))])
	case faultKillConsumer:
		return in.kill(in.consumer[in.rnd.IntN(len(in.consumer))])
	case faultKillOrders:
		return in.kill(in.orders)
	case faultBrokerConns:
		if in.e.proxy != nil {
			d := time.Second + time.Duration(in.rnd.Int64N(int64(2*time.Second)))
			in.e.proxy.Cut()
			time.Sleep(d)
			in.e.proxy.Restore()
			return fmt.Sprintf("cut through the proxy for %s", d.Round(100*time.Millisecond)), nil
		}
		return "rabbitmqctl close_all_connections --vhost " + in.e.run,
			rabbitmqctl(ctx, "close_all_connections", "--vhost", in.e.run, "--limit", "1000", "outboxkit chaos soak")
	case faultBrokerRestart:
		if err := rabbitmqctl(ctx, "stop_app"); err != nil {
			_ = rabbitmqctl(ctx, "start_app")
			return "", err
		}
		time.Sleep(2 * time.Second)
		return "rabbitmqctl stop_app; start_app", rabbitmqctl(ctx, "start_app")
	case faultDBSessions:
		n, err := in.e.terminateSessions(ctx, in.admin)
		return fmt.Sprintf("%d sessions", n), err
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}
