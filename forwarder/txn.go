package forwarder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// A TransactionalPublisher publishes in broker transactions whose records become visible to
// consumers together with a progress record of the relay's, or not at all. When the forwarder's
// Publisher is one — the Kafka backend's, when its URL names a transactional_id — every pass is a
// transaction: its rows, and the list of their seqs as the relay's progress, commit together
// before the rows are marked published. A relay that dies after the commit and before the mark
// leaves the broker's record of what it committed; the next relay of the group reads it (Recover)
// and marks those rows instead of publishing them again. So a consumer that reads only committed
// records (Kafka's read_committed) sees each row once, in each key's order, whatever point the
// relay died at.
//
// The transactional id names a relay group — the relays of one outbox, one of which publishes at
// a time: Recover fences every earlier relay of the group, whose publishes and commits fail from
// then on with errors marked outboxkit.Fenced, and Run returns such an error. Relays standing by
// wait for it with a supervisor's restart. A publisher serves one forwarder: Run refuses one that
// another forwarder's Run relays through, since the progress its transactions carry is that
// forwarder's.
type TransactionalPublisher interface {
	message.Publisher
	// Recover takes the relay group for this publisher — the broker aborts the transaction an
	// earlier publisher of the group left open and refuses that publisher from then on — and
	// returns the progress the group's last committed transaction carried; nil when none did.
	Recover(ctx context.Context) ([]byte, error)
	// Begin starts a transaction: messages published until Commit or Abort belong to it.
	Begin(ctx context.Context) error
	// Commit writes progress beside the transaction's messages and commits them together. On an
	// error the commit may or may not have taken effect: Recover tells.
	Commit(ctx context.Context, progress []byte) error
	// Abort ends the transaction without making any of its messages visible.
	Abort(ctx context.Context) error
}

// txnProgress is the progress a transactional pass commits: which outbox, and the seqs it
// published, as ranges. JSON, so that an operator reading the progress topic reads it too.
type txnProgress struct {
	Version   int        `json:"version"`
	Relay     string     `json:"relay"`     // the forwarder's Name
	Outbox    string     `json:"outbox"`    // the store's name and schema: a progress applies to one outbox only
	Published [][2]int64 `json:"published"` // inclusive ranges of seqs, ascending
	At        time.Time  `json:"at"`
}

const txnProgressVersion = 1

// encodeSeqs turns seqs into ascending inclusive ranges.
func encodeSeqs(seqs []int64) [][2]int64 {
	s := slices.Clone(seqs)
	slices.Sort(s)
	var out [][2]int64
	for _, v := range s {
		if n := len(out); n > 0 && (v == out[n-1][1] || v == out[n-1][1]+1) {
			out[n-1][1] = v
			continue
		}
		out = append(out, [2]int64{v, v})
	}
	return out
}

// decodeSeqs is encodeSeqs undone. A range is at most maxRange seqs: a progress record never
// holds more than one pass.
func decodeSeqs(ranges [][2]int64, maxRange int64) ([]int64, error) {
	var out []int64
	for _, r := range ranges {
		if r[1] < r[0] || r[1]-r[0] >= maxRange {
			return nil, fmt.Errorf("range %d-%d is not one pass's", r[0], r[1])
		}
		for v := r[0]; v <= r[1]; v++ {
			out = append(out, v)
		}
	}
	return out, nil
}

// txnState is a transactional forwarder's: whether it knows that every row its group's
// transactions committed is marked, which a pass needs before it publishes.
type txnState struct {
	pub TransactionalPublisher // nil: the publisher is not transactional
	com store.Committer
	mu  sync.Mutex // one transactional pass at a time
	// recovered: the rows of the group's last committed transaction are marked. False at start,
	// after a commit whose outcome is unknown, and after a mark that failed.
	recovered bool
}

func (f *Forwarder) outboxName() string {
	info := f.cfg.Store.Info()
	return info.Name + ":" + info.Schema
}

// recoverTxn makes sure the rows of the group's last committed transaction are marked: it asks
// the publisher for the group (fencing earlier relays of it) and its last progress, and marks the
// rows the progress lists. A progress of another outbox is refused: two outboxes share a
// transactional id.
func (f *Forwarder) recoverTxn(ctx context.Context) error {
	raw, err := f.txn.pub.Recover(ctx)
	if err != nil {
		return &txnBrokerError{fmt.Errorf("forwarder %s: read the relay group's last transaction: %w", f.cfg.Name, err)}
	}
	var seqs []int64
	if raw != nil {
		var p txnProgress
		if err := json.Unmarshal(raw, &p); err != nil || p.Version != txnProgressVersion {
			return fmt.Errorf("forwarder %s: %w: the relay group's last progress record is not one this build reads (version %d, %v): "+
				"give this relay a transactional id of its own", f.cfg.Name, errTxnRefused, p.Version, err)
		}
		if p.Outbox != f.outboxName() {
			return fmt.Errorf("forwarder %s: %w: its transactional id carries the progress of outbox %s, not of %s: "+
				"each outbox needs a transactional id of its own", f.cfg.Name, errTxnRefused, p.Outbox, f.outboxName())
		}
		if seqs, err = decodeSeqs(p.Published, int64(max(f.cfg.BatchSize, 1<<20))); err != nil {
			return fmt.Errorf("forwarder %s: %w: the relay group's last progress record: %v", f.cfg.Name, errTxnRefused, err)
		}
	}
	marked, err := f.txn.com.MarkCommitted(ctx, seqs, f.cfg.Now(), f.cfg.Retention.DeleteOnPublish)
	if err != nil {
		return err
	}
	f.txn.recovered = true
	if tm, ok := f.cfg.Metrics.(TransactionMetrics); ok && marked > 0 {
		tm.Recovered(marked)
	}
	if marked > 0 {
		f.cfg.Logger.Info("Transactional relay recorded the rows its group's last transaction committed", watermill.LogFields{
			"forwarder": f.cfg.Name, "rows": marked,
		})
	}
	return nil
}

// commitPass commits a transactional pass's published rows with their progress, or aborts the
// transaction when the pass cannot commit them all: a row that failed at the broker may have
// failed the transaction. It returns out with the rows of an aborted or failed transaction
// released, and the error that ends the relay (fenced), if any.
func (f *Forwarder) commitPass(ctx context.Context, out outcome) (outcome, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.PublishTimeout)
	defer cancel()
	if fenced := out.fenced(); fenced != nil {
		// The publisher ends the transaction without a word to the broker: its successor's start
		// aborted it.
		_ = f.txn.pub.Abort(ctx)
		f.txn.recovered = false
		f.txnEnded("fenced", len(out.published))
		return releasePublished(out), fenced
	}
	if len(out.published) == 0 || len(out.failed) > 0 || out.unreachable != nil {
		if err := f.txn.pub.Abort(ctx); err != nil {
			f.txn.recovered = false
			if outboxkit.IsFenced(err) {
				return releasePublished(out), err
			}
			f.cfg.Logger.Error("Cannot abort the pass's transaction", err, watermill.LogFields{"forwarder": f.cfg.Name})
		}
		f.txnEnded("aborted", len(out.published))
		return releasePublished(out), nil
	}
	seqs := make([]int64, len(out.published))
	for i, p := range out.published {
		seqs[i] = p.seq
	}
	progress, err := json.Marshal(txnProgress{Version: txnProgressVersion, Relay: f.cfg.Name, Outbox: f.outboxName(),
		Published: encodeSeqs(seqs), At: f.cfg.Now().UTC()})
	if err != nil {
		return releasePublished(out), err
	}
	if err := f.txn.pub.Commit(ctx, progress); err != nil {
		f.txn.recovered = false // whether it committed, only the broker knows: the next pass asks
		rows := len(out.published)
		out = releasePublished(out)
		if outboxkit.IsFenced(err) {
			f.txnEnded("fenced", rows)
			return out, err
		}
		f.txnEnded("unknown", rows)
		if out.unreachable == nil {
			out.unreachable = err
		}
		return out, nil
	}
	f.txnEnded("committed", len(out.published))
	return out, nil
}

func (f *Forwarder) txnEnded(outcome string, rows int) {
	if tm, ok := f.cfg.Metrics.(TransactionMetrics); ok {
		tm.TransactionEnded(outcome, rows)
	}
}

// fenced returns the first error of the pass that says the publisher is fenced, if any.
func (out outcome) fenced() error {
	if outboxkit.IsFenced(out.unreachable) {
		return out.unreachable
	}
	for _, fr := range out.failed {
		if outboxkit.IsFenced(fr.err) {
			return fr.err
		}
	}
	return nil
}

// releasePublished turns the published rows of a transaction that did not commit into released
// ones: the broker shows none of them.
func releasePublished(out outcome) outcome {
	out.released += len(out.published)
	out.published = nil
	return out
}

// txnRelays are the transactional publishers a Run relays through, each to its forwarder: a
// relay group's progress is one forwarder's, so two forwarders may not share a publisher.
var txnRelays sync.Map // TransactionalPublisher → *Forwarder

// claimTxnPublisher makes f the one forwarder running on its transactional publisher, until the
// returned release; an error when another forwarder runs on it.
func (f *Forwarder) claimTxnPublisher() (release func(), err error) {
	pub := f.txn.pub
	if pub == nil || !reflect.TypeOf(pub).Comparable() {
		return func() {}, nil
	}
	if prev, loaded := txnRelays.LoadOrStore(pub, f); loaded && prev != f {
		return nil, fmt.Errorf("forwarder %s: its transactional publisher is already relaying for forwarder %s: the progress a transaction "+
			"carries is one forwarder's, so each forwarder needs a publisher of its own, and each outbox a transactional id of its own",
			f.cfg.Name, prev.(*Forwarder).cfg.Name)
	}
	return func() { txnRelays.CompareAndDelete(pub, f) }, nil
}

// errNoCommitter refuses a transactional publisher on a store that cannot mark rows by seq.
var errNoCommitter = errors.New("forwarder: the publisher is transactional but the store cannot mark rows a transaction committed (store.Committer): use a store of package store's drivers")

// txnBrokerError is the broker failing a transactional pass before it publishes (its recovery,
// its transaction's start): the pass opens the circuit, as a publish that could not reach the
// broker does, rather than count as a database failure that every writer's wake-up retries.
type txnBrokerError struct{ err error }

func (e *txnBrokerError) Error() string { return e.err.Error() }
func (e *txnBrokerError) Unwrap() error { return e.err }

// brokerFailedPass is the result of a pass the broker failed before it published (txnBrokerError):
// the circuit opens, and the error is reported as the pass's UnreachableErr.
func (f *Forwarder) brokerFailedPass(err error) (Result, error) {
	var be *txnBrokerError
	if !errors.As(err, &be) || stopsRelay(err) {
		return Result{}, err
	}
	var res Result
	f.report(nil, outcome{unreachable: outboxkit.Unreachable(be.err)}, store.Outcome{}, 0, &res)
	return res, nil
}

// errTxnRefused is a transactional relay's refusal to go on with a relay group that is not its
// outbox's: no retry fixes it.
var errTxnRefused = errors.New("transactional relay refused")

// stopsRelay reports whether a pass's error ends Run: the relay fenced, or its group refused.
func stopsRelay(err error) bool {
	return outboxkit.IsFenced(err) || errors.Is(err, errTxnRefused)
}
