package forwarder

import (
	"context"

	"github.com/outboxkit/outboxkit/store"
)

// Delivery is what PublishRows did with rows another source read.
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
}

// PublishRows publishes outbox rows that another source read — the log relay of package
// forwarder/pglog, which reads them from Postgres's write-ahead log instead of claiming them —
// through the path of a pass: rows grouped by partition key, each key's rows in the order given
// and stopped at its first failure, up to MaxInFlight keys at once, the broker circuit (an
// open circuit watches the broker; a half-open one probes with the first row alone), PublishTimeout, TopicMapping, tracing,
// metrics and logs. A failed row's Attempts is the count of its failures so far: it backs off by
// Backoff or, at MaxAttempts or when permanent, is dead-lettered.
//
// It records nothing in the store: the caller keeps track of its rows and records the dead
// letters. Seq identifies a row in the Delivery and must be unique among rows. Rows neither
// published nor failed were released untouched (behind a failure of their key, a paused topic,
// the broker unreachable, or ctx ended). Safe for concurrent use.
func (f *Forwarder) PublishRows(ctx context.Context, rows []store.OutboxRow) Delivery {
	return f.publishSource(ctx, rows, false)
}

// PublishRow publishes one row as PublishRows does, for a source that keeps rows of many keys in
// flight at once, each started as soon as it may go (the log relay's dispatcher). When the broker
// goes away, its rows in flight all fail to reach it: the first to report opens the circuit, and
// the others, started while it was closed, come back released (neither published nor failed, no
// UnreachableErr) instead of each stepping the circuit's CircuitBackoff again — an outage opens
// it by one step, as one pass's failures do (two rows reporting at the same instant may take two).
func (f *Forwarder) PublishRow(ctx context.Context, row store.OutboxRow) Delivery {
	return f.publishSource(ctx, []store.OutboxRow{row}, true)
}

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
	o, dead := f.outcome(out)
	d := Delivery{Result: Result{Claimed: len(rows) + released}, Published: o.Published, Failed: o.Failed}
	f.report(rows, out, o, dead, &d.Result)
	return d
}
