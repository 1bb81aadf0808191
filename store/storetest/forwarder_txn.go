package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/store"
)

// fakeTxnPublisher is a broker with transactions, in memory: what a transaction published becomes
// visible at its commit, with its progress, and an aborted one leaves nothing. Several forwarders
// sharing one are one relay group.
type fakeTxnPublisher struct {
	mu        sync.Mutex
	open      []string // uuids published in the open transaction
	committed []string // uuids visible to a read_committed consumer, in commit order
	progress  []byte   // the last committed transaction's
	commits   int
}

func (p *fakeTxnPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.open = append(p.open, m.UUID)
	}
	return nil
}

func (p *fakeTxnPublisher) Close() error { return nil }

func (p *fakeTxnPublisher) Recover(context.Context) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = nil // the broker aborts what the group's earlier publisher left open
	return p.progress, nil
}

func (p *fakeTxnPublisher) Begin(context.Context) error { return nil }

func (p *fakeTxnPublisher) Commit(_ context.Context, progress []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.committed = append(p.committed, p.open...)
	p.open, p.progress = nil, progress
	p.commits++
	return nil
}

func (p *fakeTxnPublisher) Abort(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = nil
	return nil
}

var _ forwarder.TransactionalPublisher = (*fakeTxnPublisher)(nil)

// With a transactional publisher, a relay that dies after its transaction committed and before it
// marked the rows (here, holding the claim: on SQLite its lease) leaves the broker's record of what
// it committed, and its successor marks those rows instead of publishing them again: each row is
// committed once, in order. MarkCommitted marks only pending rows, so marking twice changes nothing.
func txnCrashAfterCommitBeforeMark[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	msgs := write(t, e, []string{"a", "b"}, 15)
	pub := &fakeTxnPublisher{}
	clk := newClock()
	dead := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.BatchSize = 20 })
	died := errors.New("the relay died after its commit, before the mark")
	faults.Inject(dead, faults.AfterCommit, func() error { return died })
	if _, err := dead.DispatchBatch(context.Background()); !errors.Is(err, died) {
		t.Fatalf("the pass returned %v, want the crash after the commit", err)
	}
	if len(pub.committed) != 20 || e.MustInt(t, pending) != 30 {
		t.Fatalf("after the crash %d rows committed, %d pending; want 20 committed, all 30 pending", len(pub.committed), e.MustInt(t, pending))
	}

	successor := newForwarder(t, e.Store, pub, clk, func(c *forwarder.Config) { c.BatchSize = 20 })
	drain(t, successor, clk)
	if e.MustInt(t, pending) != 0 {
		t.Fatalf("%d rows pending after the successor drained the outbox", e.MustInt(t, pending))
	}
	if len(pub.committed) != len(msgs) {
		t.Fatalf("%d rows committed, want each of the %d once", len(pub.committed), len(msgs))
	}
	// Each key's rows in their order, each once (keys go concurrently: only a key's order holds).
	pos := map[string]int{}
	for i, m := range msgs {
		pos[m.UUID] = i
	}
	last := map[string]int{"a": -1, "b": -1}
	seen := map[string]bool{}
	for _, id := range pub.committed {
		i, ok := pos[id]
		if !ok || seen[id] {
			t.Fatalf("row %s committed twice or unknown", id)
		}
		seen[id] = true
		key := outboxkit.PartitionKey(msgs[i])
		if i < last[key] {
			t.Fatalf("key %s: row %d committed after row %d", key, i, last[key])
		}
		last[key] = i
	}

	com, ok := store.CommitterOf(e.Store)
	if !ok {
		t.Fatal("the store is no store.Committer")
	}
	seqs := make([]int64, 0, 31)
	for i := int64(1); i <= 31; i++ {
		seqs = append(seqs, i)
	}
	if n, err := com.MarkCommitted(context.Background(), seqs, time.Now(), false); err != nil || n != 0 {
		t.Fatalf("marking published rows again marked %d (%v), want 0", n, err)
	}
}

// A transactional relay refuses a relay group whose last progress is another outbox's: two
// outboxes share a transactional id, and going on would mark one's rows from the other's record.
func txnRefusesAnotherOutboxsProgress[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	write(t, e, []string{"a"}, 3)
	pub := &fakeTxnPublisher{progress: []byte(`{"version":1,"relay":"other","outbox":"postgres:elsewhere","published":[[1,3]]}`)}
	f := newForwarder(t, e.Store, pub, newClock())
	_, err := f.DispatchBatch(context.Background())
	if err == nil || outboxkit.IsUnreachable(err) {
		t.Fatalf("a pass on another outbox's progress returned %v, want a refusal", err)
	}
	if err := f.Run(context.Background()); err == nil {
		t.Fatal("Run on another outbox's progress returned nil, want the refusal")
	}
	if e.MustInt(t, pending) != 3 {
		t.Fatal("the refused relay published or marked rows")
	}
}
