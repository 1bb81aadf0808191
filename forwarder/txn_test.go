package forwarder_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// txnBroker is a broker with transactions, in memory, that records when each commit came.
type txnBroker struct {
	mu       sync.Mutex
	open     int
	commits  []time.Time
	rows     int // committed
	progress []byte
}

func (b *txnBroker) Publish(string, ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open++
	return nil
}
func (b *txnBroker) Close() error                            { return nil }
func (b *txnBroker) Recover(context.Context) ([]byte, error) { return b.progress, nil }
func (b *txnBroker) Begin(context.Context) error             { return nil }
func (b *txnBroker) Abort(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open = 0
	return nil
}

func (b *txnBroker) Commit(_ context.Context, progress []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rows += b.open
	b.open, b.progress = 0, progress
	b.commits = append(b.commits, time.Now())
	return nil
}

func (b *txnBroker) committed() (rows int, commits []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rows, append([]time.Time(nil), b.commits...)
}

// TransactionInterval spaces a transactional relay's transactions however often writers wake it:
// rows committed meanwhile go together in the next one.
func TestTransactionInterval_SpacesTransactionsUnderWakeUps(t *testing.T) {
	const interval = 300 * time.Millisecond
	st := &pollStore{Store: openOutbox(t, 0), waking: true}
	broker := &txnBroker{}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker, TransactionInterval: interval,
		Metrics: prom.NewForwarderMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunForwarder(t, f)
	<-f.Running()
	writeRow(t, st.Store)
	st.Wake()
	if !testenv.Within(10*time.Second, func() bool { n, _ := broker.committed(); return n == 1 }) {
		t.Fatal("the first row was not committed")
	}
	// Right after the first transaction, rows each with its own wake-up: without the interval
	// each wake-up would start a pass at once.
	const more = 10
	for range more {
		writeRow(t, st.Store)
		st.Wake()
	}
	if !testenv.Within(10*time.Second, func() bool { n, _ := broker.committed(); return n == 1+more }) {
		n, _ := broker.committed()
		t.Fatalf("%d of %d rows committed", n, 1+more)
	}
	_, commits := broker.committed()
	if len(commits) < 2 {
		t.Fatalf("%d transactions for rows written after the first one committed", len(commits))
	}
	for i := 1; i < len(commits); i++ {
		if gap := commits[i].Sub(commits[i-1]); gap < interval*9/10 {
			t.Errorf("commit %d came %s after the one before, want at least TransactionInterval (%s)", i, gap, interval)
		}
	}
	t.Logf("%d rows, each with its wake-up, went in %d transactions", 1+more, len(commits))
	if n := counterValue(t, reg, "outboxkit_forwarder_transactions_total", "committed"); int(n) != len(commits) {
		t.Errorf("outboxkit_forwarder_transactions_total{outcome=committed} = %v, want %d", n, len(commits))
	}
}

// counterValue reads the counter name{outcome} from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{outcome=%q}", name, outcome)
	return 0
}

// Two forwarders may not relay through one transactional publisher: the progress its transactions
// carry is one forwarder's. The second Run refuses at once and says so.
func TestRun_RefusesATransactionalPublisherAnotherForwarderRuns(t *testing.T) {
	st := openOutbox(t, 0)
	broker := &txnBroker{}
	first, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker, Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker, Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	<-first.Running()
	err = second.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "already relaying for forwarder first") {
		t.Errorf("the second Run returned %v, want a refusal naming the first", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Once the first has stopped, another may take the publisher.
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- second.Run(ctx2) }()
	<-second.Running()
	cancel2()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// downBroker is a transactional broker that cannot be reached until up is set.
type downBroker struct {
	txnBroker
	up        atomic.Bool
	recovered atomic.Int64
}

func (b *downBroker) Recover(ctx context.Context) ([]byte, error) {
	b.recovered.Add(1)
	if !b.up.Load() {
		return nil, outboxkit.Unreachable(errors.New("kafka: no broker answered"))
	}
	return b.txnBroker.Recover(ctx)
}

// A transactional relay that cannot read its group's last transaction — the broker is away —
// opens its circuit, as a publish that cannot reach the broker does: writers' wake-ups do not make
// it ask again and again, and once the broker is back it recovers and publishes.
func TestTransactionalRecovery_BrokerAwayOpensTheCircuit(t *testing.T) {
	st := &pollStore{Store: openOutbox(t, 0), waking: true}
	broker := &downBroker{}
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker,
		CircuitBackoff: forwarder.Backoff{Initial: 100 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 1}})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunForwarder(t, f)
	<-f.Running()
	writeRow(t, st.Store)
	// Writers wake it at every poll until it has tried its recovery 4 times: a wake-up each would
	// take a few milliseconds; the circuit's backoff of 100ms makes it 300ms at least.
	start := time.Now()
	if !testenv.Within(10*time.Second, func() bool {
		st.Wake()
		return broker.recovered.Load() >= 4
	}) {
		t.Fatalf("%d recoveries in 10s with the broker away, want 4", broker.recovered.Load())
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("4 recoveries in %s under wake-ups with the broker away: the wake-ups retry it, not the circuit's backoff (100ms)", took)
	}
	if !f.Health().CircuitOpen {
		t.Error("the circuit is closed while the broker is away")
	}
	broker.up.Store(true)
	if !testenv.Within(10*time.Second, func() bool { n, _ := broker.committed(); return n == 1 }) {
		t.Fatal("the row was not published once the broker came back")
	}
}
