package forwarder

import (
	"time"
)

// Metrics receives what a forwarder does, for a metrics system: prom.NewForwarderMetrics exports
// it to Prometheus. The forwarder imports no metrics library; a program pays for one only if it
// passes one.
//
// New calls Attach once. The other methods are called from the relay's goroutines, concurrently,
// and must be cheap and safe for concurrent use. A Metrics value serves one forwarder.
type Metrics interface {
	// Attach binds the metrics to f, whose Config names it and whose Stats reads the outbox's
	// backlog; an error fails New.
	Attach(f *Forwarder) error
	// Published is called for each row the broker confirmed: sinceCommit is the time since the
	// row was written, attempts how many publishes it took (1: the first).
	Published(sinceCommit time.Duration, attempts int)
	// PublishFailed is called for each failed publish: unreachable when the broker could not be
	// reached (no attempt counted, the circuit opens), otherwise the broker refused the message.
	PublishFailed(unreachable bool)
	// DeadLettered is called with the number of rows a pass dead-lettered (0 included).
	DeadLettered(rows int)
	// PassDone is called when a pass completes: at is when, published whether it published a row.
	PassDone(at time.Time, published bool)
	// CircuitChanged is called with the broker circuit's state after a pass that tells it.
	CircuitChanged(state CircuitState)
}

// TransactionMetrics is what Metrics may also receive from a relay whose Publisher is a
// TransactionalPublisher (prom.ForwarderMetrics does). With transactions, Published counts rows the
// broker acknowledged in a transaction, visible to read_committed consumers only once it commits.
type TransactionMetrics interface {
	// TransactionEnded is called for each transaction a pass ended, with its rows: outcome
	// "committed", "aborted" (a row failed, the broker went away, or nothing was published),
	// "unknown" (the commit failed: the next pass asks the broker) or "fenced".
	TransactionEnded(outcome string, rows int)
	// Recovered is called with the rows a relay marked published from its group's last committed
	// transaction, which the relay that committed it did not live to mark.
	Recovered(rows int)
}

// nopMetrics is the Metrics of a forwarder given none.
type nopMetrics struct{}

func (nopMetrics) Attach(*Forwarder) error      { return nil }
func (nopMetrics) Published(time.Duration, int) {}
func (nopMetrics) PublishFailed(bool)           {}
func (nopMetrics) DeadLettered(int)             {}
func (nopMetrics) PassDone(time.Time, bool)     {}
func (nopMetrics) CircuitChanged(CircuitState)  {}
