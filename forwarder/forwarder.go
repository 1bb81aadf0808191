// Package forwarder is the outbox relay: it claims committed outbox rows, publishes them to a
// broker and marks them published — publish first, mark after, so a crash in between yields a
// duplicate, never a loss.
//
// Any number of forwarders may run against one outbox, in one process or on many machines: each
// pass claims rows so that no other relay takes them until it has marked them (row locks held with
// FOR UPDATE SKIP LOCKED on Postgres and MySQL, a lease on SQLite; see package store). Rows
// of one partition key are published one after another in seq order, and a row is never published
// while an earlier row of its key is still waiting; different keys are published concurrently.
//
// A publish that fails because of the message counts an attempt and backs off; after MaxAttempts
// the row is dead-lettered until ReplayOutboxDeadLetters puts it back. A publish that fails because the
// broker cannot be reached opens a circuit instead: no attempt is counted, passes pause while the
// relay watches the broker (every CircuitWatch), and the backlog drains by itself as soon as the
// broker answers again.
//
// Rows read by other means than claiming them — a database's log — go through the same publish
// path: a Source, run by RunSource, gets the forwarder's per-key lanes, circuit, backoff, dead
// letters, pauses, heartbeat, metrics and tracing, and records its own progress (package
// forwarder/pglog is one, on Postgres's write-ahead log).
package forwarder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/dbtext"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

func init() {
	faults.Inject = func(f any, point faults.Point, fn func() error) {
		switch point {
		case faults.BeforePublish:
			f.(*Forwarder).hooks.beforePublish = fn
		case faults.AfterPublish:
			f.(*Forwarder).hooks.afterPublish = fn
		case faults.AfterCommit:
			f.(*Forwarder).hooks.afterCommit = fn
		}
	}
}

// Forwarder relays outbox rows to a broker. Its methods are safe for concurrent use.
type Forwarder struct {
	cfg     Config
	owner   string // names this relay's claims, unique per Forwarder
	tracer  trace.Tracer
	circuit *circuit
	hooks   hooks
	txn     txnState // a transactional publisher's (txn.go)

	running     atomic.Bool
	startedOnce sync.Once
	started     chan struct{}

	lastPass    atomic.Int64 // unix nanoseconds of the last pass that completed
	lastPublish atomic.Int64 // unix nanoseconds of the last pass that published a row
	passSince   atomic.Int64 // unix nanoseconds of the start of the pass in progress; 0 when none
	blocked     atomic.Pointer[error]
	relay       relayState // pauses and heartbeat (pause.go)
}

// Health is what a readiness probe needs to know about the relay itself.
type Health struct {
	LastPass    time.Time // last pass that completed (zero: none yet)
	LastPublish time.Time // last pass that published at least one row (zero: none yet)
	CircuitOpen bool      // the broker could not be reached lately, or refused the relay
	// PassRunningSince is when the pass in progress started; zero when none runs. A pass waiting
	// on a broker that does not answer shows here before it ends (PublishTimeout bounds it).
	PassRunningSince time.Time
	// Blocked is the error that stops publishing until a publish gets through: the broker
	// unreachable, or refusing the relay's credentials or permissions (outboxkit.IsAccessDenied:
	// no outage ends that, only a fix). Nil while publishing works.
	Blocked error
}

// Config is the forwarder's configuration with every default filled in.
func (f *Forwarder) Config() Config { return f.cfg }

// Health reports when the relay last made a pass and last published. Stats says how old the
// backlog is; together they tell a stopped relay from an idle one.
func (f *Forwarder) Health() Health {
	h := Health{}
	if t := f.lastPass.Load(); t > 0 {
		h.LastPass = time.Unix(0, t)
	}
	if t := f.lastPublish.Load(); t > 0 {
		h.LastPublish = time.Unix(0, t)
	}
	state, _ := f.circuit.state(f.cfg.Now())
	h.CircuitOpen = state != CircuitClosed
	if t := f.passSince.Load(); t > 0 {
		h.PassRunningSince = time.Unix(0, t)
	}
	if err := f.blocked.Load(); err != nil {
		h.Blocked = *err
	}
	return h
}

func (f *Forwarder) passDone(published bool) {
	now := f.cfg.Now().UnixNano()
	f.lastPass.Store(now)
	if published {
		f.lastPublish.Store(now)
	}
	f.cfg.Metrics.PassDone(time.Unix(0, now), published)
}

// hooks let tests provoke faults at exact points of a pass. They are nil in production.
type hooks struct {
	beforePublish func() error // an error here aborts the pass after claiming, before publishing
	afterPublish  func() error // an error here aborts the pass before marking, as a crash would
	afterCommit   func() error // transactional: after the broker committed, before marking
}

// Result says what one pass did.
type Result struct {
	Claimed      int // rows locked by the pass
	Published    int // rows published and marked (or deleted, with Retention.DeleteOnPublish)
	Failed       int // rows whose publish failed because of the message; their attempt was counted
	DeadLettered int // of Failed, rows that reached MaxAttempts and were dead-lettered
	Released     int // claimed rows left untouched: behind a failure of their key, or after the broker could not be reached

	// UnreachableErr is the broker failure that stopped the pass and opened the circuit, if any.
	UnreachableErr error
	// CircuitOpen is set when the pass did nothing because the broker could not be reached
	// recently and has not answered since; RetryAt says when the next pass may ask it again.
	CircuitOpen bool
	RetryAt     time.Time
}

// New validates cfg, fills in the defaults and builds a Forwarder. It does not touch the database.
func New(cfg Config) (*Forwarder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("forwarder config: %w", err)
	}
	f := &Forwarder{
		cfg:     cfg,
		owner:   cfg.Name + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12],
		tracer:  cfg.TracerProvider.Tracer("github.com/outboxkit/outboxkit/forwarder"),
		circuit: &circuit{backoff: cfg.CircuitBackoff, watch: cfg.CircuitWatch},
		started: make(chan struct{}),
	}
	f.relay.started = cfg.Now()
	if tp, ok := cfg.Publisher.(TransactionalPublisher); ok {
		com, ok := store.CommitterOf(cfg.Store)
		if !ok {
			return nil, errNoCommitter
		}
		f.txn.pub, f.txn.com = tp, com
	}
	if err := cfg.Metrics.Attach(f); err != nil {
		return nil, fmt.Errorf("forwarder metrics: %w", err)
	}
	return f, nil
}

// DispatchBatch runs one pass: claim up to BatchSize due rows, publish them, mark the outcome and
// commit. It needs no timer or goroutine of its own, so tests call it directly. Concurrent calls,
// on one Forwarder or on several, claim disjoint rows.
//
// It returns an error when the database fails; rows published before such an error stay pending
// and are published again by a later pass (a duplicate, never a loss). A broker failure is not an
// error: it is reported in Result.UnreachableErr and the circuit opens.
func (f *Forwarder) DispatchBatch(ctx context.Context) (Result, error) {
	now := f.cfg.Now()
	f.passSince.Store(now.UnixNano())
	defer f.passSince.Store(0)
	limit, inFlight := f.cfg.BatchSize, f.cfg.MaxInFlight
	state, _ := f.circuit.state(now)
	if state == CircuitOpen && f.watchBroker(ctx, now) {
		state, now = CircuitHalfOpen, f.cfg.Now() // the broker answers again: publish now
	}
	switch state {
	case CircuitOpen:
		_, watching := f.cfg.Publisher.(checker)
		return Result{CircuitOpen: true, RetryAt: f.circuit.nextWake(watching)}, nil
	case CircuitHalfOpen:
		limit, inFlight = 1, 1 // probe the broker with a single message
	}

	if f.txn.pub != nil {
		// One transaction at a time, and none before the group's last one is recorded.
		f.txn.mu.Lock()
		defer f.txn.mu.Unlock()
		if !f.txn.recovered {
			if err := f.recoverTxn(ctx); err != nil {
				return f.brokerFailedPass(err)
			}
		}
	}

	// If this process stalls holding the rows, the store gives them to another relay.
	claim, err := f.cfg.Store.Claim(ctx, store.ClaimParams{Now: now, Limit: limit, ParkKeyOnDeadLetter: f.cfg.ParkKeyOnDeadLetter,
		Hold: f.cfg.PublishTimeout + 5*time.Second, Owner: f.owner, Relay: f.cfg.Name})
	if err != nil {
		return Result{}, err
	}
	defer claim.Abandon(ctx) // a no-op after Finish
	rows := claim.Rows()
	res := Result{Claimed: len(rows)}
	if res.Claimed == 0 {
		if err := claim.Finish(ctx, store.Outcome{Now: now}); err != nil {
			return res, err
		}
		f.passDone(false)
		return res, nil
	}

	if f.hooks.beforePublish != nil {
		if err := f.hooks.beforePublish(); err != nil {
			return Result{}, err
		}
	}
	txnOpen := false
	if f.txn.pub != nil {
		if err := f.txn.pub.Begin(ctx); err != nil {
			return f.brokerFailedPass(&txnBrokerError{fmt.Errorf("forwarder %s: begin the pass's transaction: %w", f.cfg.Name, err)})
		}
		txnOpen = true
		defer func() {
			if txnOpen { // a pass that ends early (a test's crash) aborts what it began
				_ = f.txn.pub.Abort(context.WithoutCancel(ctx))
				f.txn.recovered = false
			}
		}()
	}
	publishCtx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	out := f.publishGroups(publishCtx, groupByKey(rows), inFlight)
	cancel()

	if f.hooks.afterPublish != nil {
		if err := f.hooks.afterPublish(); err != nil {
			return Result{}, err
		}
	}
	if f.txn.pub != nil {
		var err error
		txnOpen = false
		if out, err = f.commitPass(ctx, out); err != nil {
			return Result{}, fmt.Errorf("forwarder %s: %w", f.cfg.Name, err)
		}
		if f.hooks.afterCommit != nil && len(out.published) > 0 {
			if err := f.hooks.afterCommit(); err != nil {
				return Result{}, err
			}
		}
	}

	// Mark even when ctx has ended: what was published should not be published again.
	markCtx, cancelMark := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancelMark()
	outcome, dead := f.outcome(out)
	if err := claim.Finish(markCtx, outcome); err != nil {
		if f.txn.pub != nil && len(outcome.Published) > 0 {
			f.txn.recovered = false // committed, not marked: the next pass marks them from the broker's record
		}
		return Result{}, err
	}

	f.report(rows, out, outcome, dead, &res)
	return res, nil
}

// report accounts for what the publishing phase did, once the store has recorded it (or, for
// rows of a Source, once they are handed back): the result, the metrics, the circuit and
// the logs.
func (f *Forwarder) report(rows []store.OutboxRow, out outcome, outcome store.Outcome, dead int, res *Result) {
	res.Published = len(out.published)
	f.countPublished(rows, out.published)
	res.Failed = len(out.failed)
	res.DeadLettered = dead
	res.Released = out.released
	res.UnreachableErr = out.unreachable
	f.cfg.Metrics.DeadLettered(dead)
	f.passDone(res.Published > 0)

	if out.unreachable != nil {
		retryAt := f.circuit.recordUnreachable(f.cfg.Now(), outboxkit.IsAccessDenied(out.unreachable))
		f.blocked.Store(&out.unreachable)
		f.cfg.Metrics.CircuitChanged(CircuitOpen)
		fields := watermill.LogFields{"forwarder": f.cfg.Name, "retry_at": retryAt, "published": res.Published}
		if outboxkit.IsAccessDenied(out.unreachable) {
			// Said at every probe: no outage ends this, only a fix of the configuration.
			f.cfg.Logger.Error("The broker refused the relay's credentials or permissions: rows wait until the configuration is fixed",
				out.unreachable, fields)
		} else {
			f.cfg.Logger.Error("Broker unreachable, circuit open", out.unreachable, fields)
		}
	} else if res.Published > 0 || res.Failed > 0 {
		f.blocked.Store(nil)
		if f.circuit.recordReachable() {
			f.cfg.Logger.Info("Broker reachable again, circuit closed", watermill.LogFields{"forwarder": f.cfg.Name})
		}
		f.cfg.Metrics.CircuitChanged(CircuitClosed)
	}
	for i, fr := range out.failed {
		fields := watermill.LogFields{"forwarder": f.cfg.Name, "seq": fr.seq, "attempt": fr.attempts + 1, "error": fr.err.Error()}
		if outcome.Failed[i].DeadLettered {
			fields["permanent"] = fr.permanent
			logs.Warn(f.cfg.Logger, "Outbox row dead-lettered: it waits for an operator's replay", nil, fields)
			continue
		}
		f.cfg.Logger.Info("Outbox row publish failed, backing off", fields.Add(watermill.LogFields{"next_attempt_at": outcome.Failed[i].NextAttemptAt}))
	}
}

// outcome turns the publishing phase's result into what the store records, and counts the rows it
// dead-letters: a failed row backs off, or is dead-lettered once it reaches MaxAttempts.
func (f *Forwarder) outcome(out outcome) (store.Outcome, int) {
	now := f.cfg.Now()
	o := store.Outcome{Now: now, DeleteOnPublish: f.cfg.Retention.DeleteOnPublish}
	for _, p := range out.published {
		o.Published = append(o.Published, p.seq)
	}
	dead := 0
	for _, fr := range out.failed {
		row := store.FailedRow{Seq: fr.seq, Error: dbtext.Storable(fr.err.Error())}
		if attempts := fr.attempts + 1; attempts >= f.cfg.MaxAttempts || fr.permanent {
			row.DeadLettered = true
			dead++
		} else {
			row.NextAttemptAt = now.Add(f.cfg.Backoff.Delay(attempts))
		}
		o.Failed = append(o.Failed, row)
	}
	return o, dead
}

// errAlreadyRunning is returned by a Run or RunSource while another runs on the Forwarder.
var errAlreadyRunning = errors.New("forwarder: Run or RunSource is already running on this Forwarder; create another Forwarder for more relays")
