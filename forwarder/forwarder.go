// Package forwarder is the outbox relay: it claims committed outbox rows, publishes them to a
// broker and marks them published — publish first, mark after, so a crash in between yields a
// duplicate, never a loss.
//
// Any number of forwarders may run against one outbox, in one process or on many machines: each
// pass claims rows with FOR UPDATE SKIP LOCKED and holds the locks until it has marked them. Rows
// of one partition key are published one after another in seq order, and a row is never published
// while an earlier row of its key is still waiting; different keys are published concurrently.
//
// A publish that fails because of the message counts an attempt and backs off; after MaxAttempts
// the row is dead-lettered until ReplayDeadLetters puts it back. A publish that fails because the
// broker cannot be reached opens a circuit instead: no attempt is counted, passes pause and probe
// with backoff, and the backlog drains by itself when the broker returns.
package forwarder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit/internal/pgtext"
	"github.com/outboxkit/outboxkit/internal/schema"
)

// Forwarder relays outbox rows to a broker. Its methods are safe for concurrent use.
type Forwarder struct {
	cfg     Config
	schema  schema.Name
	q       queries
	outbox  *Outbox
	tracer  trace.Tracer
	circuit *circuit
	metrics *metrics
	hooks   hooks

	running     atomic.Bool
	startedOnce sync.Once
	started     chan struct{}

	lastPass    atomic.Int64 // unix nanoseconds of the last pass that completed
	lastPublish atomic.Int64 // unix nanoseconds of the last pass that published a row
}

// Health is what a readiness probe needs to know about the relay itself.
type Health struct {
	LastPass    time.Time // last pass that completed (zero: none yet)
	LastPublish time.Time // last pass that published at least one row (zero: none yet)
	CircuitOpen bool      // the broker could not be reached lately
}

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
	h.CircuitOpen = state != circuitClosed
	return h
}

func (f *Forwarder) passDone(published bool) {
	now := f.cfg.Now().UnixNano()
	f.lastPass.Store(now)
	if published {
		f.lastPublish.Store(now)
	}
	f.metrics.pass(published)
}

// hooks let tests provoke faults at exact points of a pass. They are nil in production.
type hooks struct {
	beforePublish func() error // an error here aborts the pass after claiming, before publishing
	afterPublish  func() error // an error here aborts the pass before marking, as a crash would
}

// Result says what one pass did.
type Result struct {
	Claimed      int // rows locked by the pass
	Published    int // rows published and marked (or deleted, with Retention.DeleteOnPublish)
	Failed       int // rows whose publish failed because of the message; their attempt was counted
	DeadLettered int // of Failed, rows that reached MaxAttempts and were dead-lettered
	Released     int // claimed rows left untouched: behind a failure of their key, or after a transport failure

	// TransportErr is the broker failure that stopped the pass and opened the circuit, if any.
	TransportErr error
	// CircuitOpen is set when the pass did nothing because the broker could not be reached
	// recently; RetryAt says when the next pass may probe it.
	CircuitOpen bool
	RetryAt     time.Time
}

// New validates cfg, fills in the defaults and builds a Forwarder. It does not touch the database.
func New(cfg Config) (*Forwarder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("forwarder config: %w", err)
	}
	name := schema.MustParse(cfg.Schema)
	outbox, err := NewOutbox(cfg.Pool, OutboxConfig{Schema: cfg.Schema, Now: cfg.Now})
	if err != nil {
		return nil, err
	}
	f := &Forwarder{
		cfg:     cfg,
		schema:  name,
		q:       outbox.q,
		outbox:  outbox,
		tracer:  cfg.TracerProvider.Tracer("github.com/outboxkit/outboxkit/forwarder"),
		circuit: &circuit{backoff: cfg.CircuitBackoff},
		started: make(chan struct{}),
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name, string(name), f)
	if err != nil {
		return nil, fmt.Errorf("forwarder metrics: %w", err)
	}
	f.metrics = m
	return f, nil
}

// DispatchBatch runs one pass: claim up to BatchSize due rows, publish them, mark the outcome and
// commit. It needs no timer or goroutine of its own, so tests call it directly. Concurrent calls,
// on one Forwarder or on several, claim disjoint rows.
//
// It returns an error when the database fails; rows published before such an error stay pending
// and are published again by a later pass (a duplicate, never a loss). A broker failure is not an
// error: it is reported in Result.TransportErr and the circuit opens.
func (f *Forwarder) DispatchBatch(ctx context.Context) (Result, error) {
	now := f.cfg.Now()
	limit, inFlight := f.cfg.BatchSize, f.cfg.MaxInFlight
	switch state, retryAt := f.circuit.state(now); state {
	case circuitOpen:
		return Result{CircuitOpen: true, RetryAt: retryAt}, nil
	case circuitHalfOpen:
		limit, inFlight = 1, 1 // probe the broker with a single message
	}

	tx, err := f.cfg.Pool.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("begin outbox pass: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit

	// If this process stalls with the rows locked, Postgres ends the session and frees them.
	idle := f.cfg.PublishTimeout + 5*time.Second
	if _, err := tx.Exec(ctx, "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
		fmt.Sprintf("%dms", idle.Milliseconds())); err != nil {
		return Result{}, fmt.Errorf("begin outbox pass: %w", err)
	}
	groups, err := f.claim(ctx, tx, now, limit)
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, g := range groups {
		res.Claimed += len(g)
	}
	if res.Claimed == 0 {
		if err := tx.Commit(ctx); err != nil {
			return res, fmt.Errorf("commit outbox pass: %w", err)
		}
		f.passDone(false)
		return res, nil
	}

	if f.hooks.beforePublish != nil {
		if err := f.hooks.beforePublish(); err != nil {
			return Result{}, err
		}
	}
	publishCtx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	out := f.publishGroups(publishCtx, groups, inFlight)
	cancel()

	if f.hooks.afterPublish != nil {
		if err := f.hooks.afterPublish(); err != nil {
			return Result{}, err
		}
	}

	// Mark even when ctx has ended: what was published should not be published again.
	markCtx, cancelMark := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancelMark()
	dead, err := f.mark(markCtx, tx, out)
	if err != nil {
		return Result{}, err
	}
	if err := tx.Commit(markCtx); err != nil {
		return Result{}, fmt.Errorf("commit outbox pass: %w", err)
	}

	res.Published = len(out.published)
	res.Failed = len(out.failed)
	res.DeadLettered = dead
	res.Released = out.released
	res.TransportErr = out.transport
	f.metrics.published.Add(float64(res.Published))
	f.metrics.deadLettered.Add(float64(dead))
	f.passDone(res.Published > 0)

	if out.transport != nil {
		retryAt := f.circuit.recordTransportFailure(f.cfg.Now(), out.transport)
		f.metrics.circuit.Set(float64(circuitOpen))
		f.cfg.Logger.Error("Broker unreachable, circuit open", out.transport, watermill.LogFields{
			"forwarder": f.cfg.Name, "retry_at": retryAt, "published": res.Published,
		})
	} else if res.Published > 0 || res.Failed > 0 {
		if f.circuit.recordReachable() {
			f.cfg.Logger.Info("Broker reachable again, circuit closed", watermill.LogFields{"forwarder": f.cfg.Name})
		}
		f.metrics.circuit.Set(float64(circuitClosed))
	}
	for _, fr := range out.failed {
		f.cfg.Logger.Info("Outbox row publish failed", watermill.LogFields{
			"forwarder": f.cfg.Name, "seq": fr.seq, "attempt": fr.attempts + 1, "error": fr.err.Error(),
		})
	}
	return res, nil
}

// mark writes the outcome of the publishing phase and returns how many rows were dead-lettered.
func (f *Forwarder) mark(ctx context.Context, tx pgx.Tx, out outcome) (int, error) {
	now := f.cfg.Now()
	if len(out.published) > 0 {
		seqs := make([]int64, len(out.published))
		for i, p := range out.published {
			seqs[i] = p.seq
		}
		var err error
		if f.cfg.Retention.DeleteOnPublish {
			_, err = tx.Exec(ctx, f.q.deletePublished, seqs)
		} else {
			_, err = tx.Exec(ctx, f.q.markPublished, now, seqs)
		}
		if err != nil {
			return 0, fmt.Errorf("mark outbox rows published: %w", err)
		}
	}
	if len(out.failed) == 0 {
		return 0, nil
	}
	var (
		seqs   = make([]int64, len(out.failed))
		errs   = make([]string, len(out.failed))
		nextAt = make([]pgtype.Timestamptz, len(out.failed))
		deadAt = make([]pgtype.Timestamptz, len(out.failed))
		dead   int
	)
	for i, fr := range out.failed {
		seqs[i] = fr.seq
		errs[i] = pgtext.Storable(fr.err.Error())
		if attempts := fr.attempts + 1; attempts >= f.cfg.MaxAttempts {
			deadAt[i] = pgtype.Timestamptz{Time: now, Valid: true}
			dead++
		} else {
			nextAt[i] = pgtype.Timestamptz{Time: now.Add(f.cfg.Backoff.Delay(attempts)), Valid: true}
		}
	}
	if _, err := tx.Exec(ctx, f.q.markFailed, seqs, errs, nextAt, deadAt); err != nil {
		return 0, fmt.Errorf("record failed outbox publishes: %w", err)
	}
	return dead, nil
}

// errAlreadyRunning is returned by a second concurrent Run.
var errAlreadyRunning = errors.New("forwarder: Run is already running on this Forwarder; create another Forwarder for more relays")
