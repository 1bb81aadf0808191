package forwarder

import (
	"context"
	"errors"
	"sync"

	"github.com/outboxkit/outboxkit/store"
)

// A Source reads outbox rows by other means than claiming them — a database's log, say — and
// hands them to the forwarder's publish path through the SourceRelay that RunSource gives it, so
// that a broker sees the same messages as from the polling relay. Package forwarder/pglog is one:
// it reads Postgres's write-ahead log.
//
// Relay runs until ctx ends, then returns nil, or returns the error that stops it sooner; either
// way only once every goroutine it started has stopped. The rows are the source's to keep track
// of: the forwarder records nothing in the store for them, so the source records what its
// deliveries say (its position, its dead letters) itself.
type Source interface {
	Relay(ctx context.Context, r *SourceRelay) error
}

// SourceRelay is the forwarder as a Source sees it: its publish path (PublishRows, PublishRow),
// the pauses its heartbeat reads (Paused, Pausing, RelayPaused, PausesChanged) and its liveness
// (IdlePass). RunSource makes one for each run and passes it to the source's Relay; after Relay
// returns the heartbeat has stopped, so the pauses it reports are no longer read. Its methods are
// safe for concurrent use; a SourceRelay not made by RunSource is not usable.
type SourceRelay struct{ f *Forwarder }

// errNilSource is RunSource's refusal of a nil Source.
var errNilSource = errors.New("forwarder: RunSource needs a Source, got nil")

// RunSource runs s with the forwarder's publish path, pauses and heartbeat until s returns — which
// it does once ctx ends — and returns what s returned, once the heartbeat has stopped too: no
// goroutine it started outlives it.
//
// The heartbeat reads the pauses and reports the relay every HeartbeatInterval, as Run's does,
// from RunSource's start to s's return (a source that flushes its work after ctx ended is still
// reported meanwhile); it does nothing when the store keeps no pauses (store.RelayControl).
// RunSource runs no pass and no retention: PrunePublished is the caller's, if it keeps published
// rows at all. It may not run at once with Run or another RunSource on one Forwarder: it returns
// an error at once.
func (f *Forwarder) RunSource(ctx context.Context, s Source) error {
	if s == nil {
		return errNilSource
	}
	if !f.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer f.running.Store(false)

	// Not ended by ctx: the source's last work after ctx ended is reported too.
	hbCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		stopHeartbeat()
		wg.Wait()
	}()
	if rc, ok := store.RelayControlOf(f.cfg.Store); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.heartbeatLoop(hbCtx, rc)
		}()
	}
	return s.Relay(ctx, &SourceRelay{f: f})
}

// Delivery is what SourceRelay.PublishRows or PublishRow did with a source's rows.
type Delivery struct {
	// Result counts the rows as a pass does (Claimed is how many were given), and says whether the
	// broker could not be reached (UnreachableErr; the circuit is open) or was not tried because
	// the circuit is open (CircuitOpen, RetryAt).
	Result
	// Published are the Seq of the rows the broker confirmed.
	Published []int64
	// Failed are the rows whose publish failed because of the message: each is to be tried again
	// at NextAttemptAt, or, DeadLettered, parked for an operator. The caller records them.
	Failed []store.FailedRow
	// Fenced is the publisher's refusal of this relay for good (outboxkit.IsFenced): another relay
	// of its group took over. The rows are then released, none failed, and the source stops.
	Fenced error
}

// PublishRows publishes rows the source read through the path of a pass: rows grouped by
// partition key, each key's rows in the order given and stopped at its first failure, up to
// MaxInFlight keys at once, the broker circuit (an open circuit watches the broker; a half-open
// one probes with the first row alone), PublishTimeout, TopicMapping, tracing, metrics and logs.
// A row whose topic or relay is paused (as of the pauses the heartbeat last read) is not
// published. A failed row's Attempts is the count of its failures so far: it backs off by Backoff
// or, at MaxAttempts or when permanent, is dead-lettered.
//
// It records nothing in the store: the caller keeps track of its rows and records the dead
// letters. Seq identifies a row in the Delivery and must be unique among rows. Rows neither
// published nor failed were released untouched (behind a failure of their key, a pause, the
// broker unreachable, or ctx ended).
func (r *SourceRelay) PublishRows(ctx context.Context, rows []store.OutboxRow) Delivery {
	return r.f.publishSource(ctx, rows, false)
}

// PublishRow publishes one row as PublishRows does, for a source that keeps rows of many keys in
// flight at once, each started as soon as it may go. When the broker goes away, its rows in
// flight all fail to reach it: the first to report opens the circuit, and the others, started
// while it was closed, come back released (neither published nor failed, no UnreachableErr)
// instead of each stepping the circuit's CircuitBackoff again — an outage opens it by one step, as
// one pass's failures do (two rows reporting at the same instant may take two).
func (r *SourceRelay) PublishRow(ctx context.Context, row store.OutboxRow) Delivery {
	return r.f.publishSource(ctx, []store.OutboxRow{row}, true)
}

// Paused reports whether a row of topic must wait now: its topic or the relay (by the forwarder's
// Name) is paused, as of the pauses the heartbeat last read. A source holding rows asks it to
// skip the paused ones; PublishRows itself publishes none.
func (r *SourceRelay) Paused(topic string) bool { return r.f.paused(topic) }

// Pausing reports whether any pause that concerns this relay is in force: its Name's, or a
// topic's.
func (r *SourceRelay) Pausing() bool { return r.f.pausing() }

// RelayPaused reports whether relays of the forwarder's Name are paused, as of the pauses the
// heartbeat last read.
func (r *SourceRelay) RelayPaused() bool { return r.f.relayPaused() }

// PausesChanged returns a channel closed once the heartbeat reads pauses other than the ones in
// force when it was called: a source holding paused rows waits on it to go on at once on resume.
func (r *SourceRelay) PausesChanged() <-chan struct{} { return r.f.pausesChanged() }

// IdlePass records a round of the source that had nothing to publish, so that Health's LastPass
// (and the last-pass metric, and the heartbeat's) stay current while it is idle or paused. A
// round that publishes records itself.
func (r *SourceRelay) IdlePass() { r.f.passDone(false) }

// Transactions returns the forwarder's publisher when it is a TransactionalPublisher, nil
// otherwise. A source that relays through one runs the transactions itself: it begins one, hands
// its rows to PublishRows or PublishRow, and commits them with a progress record of its own, from
// which, after Recover, it knows what the broker already committed. The forwarder begins none for
// a source.
func (r *SourceRelay) Transactions() TransactionalPublisher { return r.f.txn.pub }

// publishSource is PublishRows, and with lone PublishRow.
func (f *Forwarder) publishSource(ctx context.Context, rows []store.OutboxRow, lone bool) Delivery {
	inFlight := f.cfg.MaxInFlight
	released := 0
	now := f.cfg.Now()
	state, _ := f.circuit.state(now)
	if state == CircuitOpen && f.watchBroker(ctx, now) {
		state = CircuitHalfOpen // the broker answers again: publish now
	}
	switch state {
	case CircuitOpen:
		_, watching := f.cfg.Publisher.(checker)
		return Delivery{Result: Result{Claimed: len(rows), Released: len(rows), CircuitOpen: true, RetryAt: f.circuit.nextWake(watching)}}
	case CircuitHalfOpen:
		if len(rows) > 1 {
			released, rows, inFlight = len(rows)-1, rows[:1], 1 // probe the broker with a single message
		}
	}
	publishCtx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	out := f.publishGroups(publishCtx, groupByKey(rows), inFlight)
	cancel()
	if lone && out.unreachable != nil && state == CircuitClosed && f.circuit.isOpen() {
		out.unreachable = nil // another row in flight opened the circuit for this outage
	}
	out.released += released
	if fenced := out.fenced(); fenced != nil {
		// Not the rows' failure, and not an outage: the source stops, its successor publishes them.
		n := len(rows) + released
		return Delivery{Result: Result{Claimed: n, Released: n}, Fenced: fenced}
	}
	o, dead := f.outcome(out)
	d := Delivery{Result: Result{Claimed: len(rows) + released}, Published: o.Published, Failed: o.Failed}
	f.report(rows, out, o, dead, &d.Result)
	return d
}
