package pglog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// txnBroker is a broker with transactions, in memory: what a transaction published becomes
// visible at its commit, with its progress, and an aborted one leaves nothing. Its producers are
// the publishers of one relay group: a producer's Recover fences the earlier ones, whose
// publishes and commits fail from then on with errors marked outboxkit.Fenced, and drops what
// they left open — as Kafka's InitProducerID does for a transactional id.
type txnBroker struct {
	mu        sync.Mutex
	epoch     int
	committed []*message.Message // visible to a read_committed consumer, in commit order
	progress  []byte             // the last committed transaction's
	commits   int
	aborts    int
}

// txnProducer is one relay's publisher of a txnBroker.
type txnProducer struct {
	b     *txnBroker
	epoch int // 0 until Recover
	inTxn bool
	open  []*message.Message
	sent  int // messages published, committed or not
	// fail, when set, refuses a message with its error. The message lands in the transaction all
	// the same, as a produce that timed out may: committing the transaction shows it.
	fail func(*message.Message) error
	// afterPublish, when set, runs after each message published, with the producer's count.
	afterPublish func(n int)
}

func newTxnBroker() *txnBroker { return &txnBroker{} }

func (b *txnBroker) producer() *txnProducer { return &txnProducer{b: b} }

// fencedLocked says why p may not write, if it may not; b.mu held.
func (p *txnProducer) fencedLocked() error {
	if p.epoch != p.b.epoch {
		return outboxkit.Fenced(fmt.Errorf("producer of epoch %d, the group's is %d", p.epoch, p.b.epoch))
	}
	return nil
}

func (p *txnProducer) Publish(_ string, msgs ...*message.Message) error {
	p.b.mu.Lock()
	if err := p.fencedLocked(); err != nil {
		p.b.mu.Unlock()
		return err
	}
	if !p.inTxn {
		p.b.mu.Unlock()
		return errors.New("publish outside a transaction")
	}
	for _, m := range msgs {
		if p.fail != nil {
			if err := p.fail(m); err != nil {
				p.open = append(p.open, m)
				p.b.mu.Unlock()
				return err
			}
		}
		p.open = append(p.open, m)
	}
	p.sent += len(msgs)
	n, after := p.sent, p.afterPublish
	p.b.mu.Unlock()
	if after != nil {
		after(n)
	}
	return nil
}

func (p *txnProducer) Close() error { return nil }

func (p *txnProducer) Recover(context.Context) ([]byte, error) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	p.b.epoch++
	p.epoch, p.inTxn, p.open = p.b.epoch, false, nil
	return p.b.progress, nil
}

func (p *txnProducer) Begin(context.Context) error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.fencedLocked(); err != nil {
		return err
	}
	if p.inTxn {
		return errors.New("begin inside a transaction")
	}
	p.inTxn = true
	return nil
}

func (p *txnProducer) Commit(_ context.Context, progress []byte) error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.fencedLocked(); err != nil {
		return err
	}
	if !p.inTxn {
		return errors.New("commit outside a transaction")
	}
	p.b.committed = append(p.b.committed, p.open...)
	p.b.progress = progress
	p.b.commits++
	p.inTxn, p.open = false, nil
	return nil
}

func (p *txnProducer) Abort(context.Context) error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.fencedLocked(); err != nil {
		return err
	}
	p.b.aborts++
	p.inTxn, p.open = false, nil
	return nil
}

var _ forwarder.TransactionalPublisher = (*txnProducer)(nil)

// visible is how many messages the broker's committed transactions hold.
func (b *txnBroker) visible() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.committed)
}

// has reports whether the committed transactions hold every id.
func (b *txnBroker) has(ids []string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range b.committed {
		seen[m.UUID] = true
	}
	for _, id := range ids {
		if !seen[id] {
			return false
		}
	}
	return true
}

// checkExactlyOnce fails t unless the committed transactions hold each of ids once, each key's
// in the order of ids (a key's events were written in that order), and nothing else.
func (b *txnBroker) checkExactlyOnce(t *testing.T, ids []string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	pos := map[string]int{}
	for i, id := range ids {
		pos[id] = i
	}
	seen := map[string]int{}
	last := map[string]int{}
	dups := 0
	for _, m := range b.committed {
		i, ok := pos[m.UUID]
		if !ok {
			t.Errorf("message %s committed, not one of the events", m.UUID)
			continue
		}
		if seen[m.UUID]++; seen[m.UUID] > 1 {
			dups++
			continue
		}
		key := m.Metadata.Get(outboxkit.MetadataPartitionKey)
		if l, ok := last[key]; ok && i < l {
			t.Errorf("key %s: event %d committed after event %d", key, i, l)
		}
		last[key] = i
	}
	if dups > 0 {
		t.Errorf("%d duplicates among the %d messages committed", dups, len(b.committed))
	}
	if len(seen) != len(ids) {
		t.Errorf("%d of the %d events committed", len(seen), len(ids))
	}
}

// writeKeys writes txns transactions of n events each, over keys keys, and returns the ids in
// the order written.
func writeKeys(t *testing.T, pg *testenv.PG, txns, n, keys int) []string {
	t.Helper()
	var ids []string
	for i := range txns {
		ids = append(ids, write(t, pg, fmt.Sprintf("k%d", i%keys), n)...)
	}
	return ids
}

// outboxRows counts the rows left in the outbox.
func outboxRows(t *testing.T, pg *testenv.PG) int {
	t.Helper()
	return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`)
}

// seqsOf maps the outbox rows' uuids to their seqs.
func seqsOf(t *testing.T, pg *testenv.PG) map[string]int64 {
	t.Helper()
	rows, err := pg.Pool.Query(context.Background(), pg.Schema.Render(`SELECT uuid::text, seq FROM {{schema}}.outbox`))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		m[id] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// unlisted counts the rows of seqs removed from the outbox that the last progress does not list.
func (b *txnBroker) unlisted(t *testing.T, seqs map[string]int64, pg *testenv.PG) int {
	t.Helper()
	b.mu.Lock()
	raw := b.progress
	b.mu.Unlock()
	var p struct{ Published [][2]int64 }
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("progress %s: %v", raw, err)
	}
	left := seqsOf(t, pg)
	n := 0
	for id, seq := range seqs {
		if _, ok := left[id]; ok {
			continue
		}
		listed := false
		for _, r := range p.Published {
			listed = listed || (r[0] <= seq && seq <= r[1])
		}
		if !listed {
			n++
		}
	}
	return n
}

// A relay that dies after its transaction committed and before its checkpoint ran leaves the rows
// in the table and the slot behind them; its successor reads the group's last progress and the
// table's position and publishes none of them again: each event is committed once, in its key's
// order. From the log (the rows the slot replays: below the table's position, and listed by the
// progress beyond it) and from a backfill (rows read from the table, the relay dying before the
// backfill was recorded).
func TestTxnCrashAfterCommitBeforeCheckpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		fromLog  bool
		dieAfter int // the commit after which the relay dies
	}{
		{"log, first commit", true, 1},
		{"log, fourth commit", true, 4},
		{"backfill, first commit", false, 1},
		{"backfill, second commit", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			b := newTxnBroker()
			if tc.fromLog {
				// The slot exists and its checkpoint is set: what follows is read from the log.
				if err := run(t, relayOn(t, pg, b.producer(), nil))(); err != nil {
					t.Fatal(err)
				}
			}
			// Transactions of 3 events, so that the first ones are complete, and behind the position a
			// checkpoint records, before the relay dies.
			ids := writeKeys(t, pg, 100, 3, 7)
			seqs := seqsOf(t, pg)

			ctx, kill := context.WithCancel(context.Background())
			defer kill()
			commits := 0
			dead := relayOn(t, pg, b.producer(), func(_ *forwarder.Config, c *pglog.Config) {
				// Transactions of 40 rows; the slot is told nothing (the status goes out hourly),
				// so it replays from where the relay started.
				c.FlushRows, c.FlushInterval, c.StatusInterval = 40, time.Hour, time.Hour
			})
			pglog.CrashOnStop(dead)
			pglog.AfterCommit(dead, func() {
				if commits++; commits == tc.dieAfter {
					kill()
				}
			})
			if err := dead.Run(ctx); err != nil {
				t.Fatal(err)
			}
			before := b.visible()
			if before < 40*tc.dieAfter || before >= len(ids) {
				t.Fatalf("%d events committed before the crash, want at least %d and not all %d", before, 40*tc.dieAfter, len(ids))
			}
			if n := outboxRows(t, pg); n <= len(ids)-before {
				t.Fatalf("%d rows left after the crash, want more than %d: the last commit's checkpoint did not run", n, len(ids)-before)
			}
			if tc.fromLog && tc.dieAfter > 1 {
				// The checkpoints before the last commit recorded a position the slot was not told of:
				// the slot replays rows they removed, which the last progress no longer lists — only
				// the table's position says they are published.
				ahead := pg.Int(t, `SELECT (c.confirmed_lsn - s.confirmed_flush_lsn)::bigint FROM {{schema}}.log_relays c
					JOIN pg_replication_slots s ON s.slot_name = c.slot_name`)
				if ahead <= 0 {
					t.Fatalf("the table's position is %d bytes ahead of the slot's, want it ahead", ahead)
				}
				if n := b.unlisted(t, seqs, pg); n == 0 {
					t.Fatal("every row removed before the crash is listed by the last progress: the position covers none")
				}
			}

			run(t, relayOn(t, pg, b.producer(), nil))
			testenv.Eventually(t, 20*time.Second, "every event committed", func() bool { return b.has(ids) })
			testenv.Eventually(t, 10*time.Second, "the outbox empty", func() bool { return outboxRows(t, pg) == 0 })
			b.checkExactlyOnce(t, ids)
			t.Logf("%d committed before the crash after commit %d, %d in all", before, tc.dieAfter, b.visible())
		})
	}
}

// A relay that dies with its transaction open made none of it visible: its successor fences it
// (the broker drops the open transaction) and publishes those rows again, once; the rows of the
// transactions it committed before are not published again.
func TestTxnCrashWithTransactionOpen(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	b := newTxnBroker()
	if err := run(t, relayOn(t, pg, b.producer(), nil))(); err != nil {
		t.Fatal(err)
	}
	ids := writeKeys(t, pg, 20, 10, 5)

	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	p := b.producer()
	p.afterPublish = func(n int) {
		if n == 100 { // in the third transaction, 20 rows into it
			kill()
		}
	}
	dead := relayOn(t, pg, p, func(_ *forwarder.Config, c *pglog.Config) {
		c.FlushRows, c.FlushInterval, c.StatusInterval = 40, time.Hour, time.Hour
	})
	pglog.CrashOnStop(dead)
	if err := dead.Run(ctx); err != nil {
		t.Fatal(err)
	}
	before := b.visible()
	if before < 80 || before >= 100 {
		t.Fatalf("%d events committed before the crash, want those of the two transactions before it (80 to 99)", before)
	}

	run(t, relayOn(t, pg, b.producer(), nil))
	testenv.Eventually(t, 20*time.Second, "every event committed", func() bool { return b.has(ids) })
	testenv.Eventually(t, 10*time.Second, "the outbox empty", func() bool { return outboxRows(t, pg) == 0 })
	b.checkExactlyOnce(t, ids)
}

// A relay whose group another relay took over is fenced: whether the broker refuses its next
// publish or its commit, its Run returns the error marked outboxkit.Fenced, and nothing it
// published since the takeover becomes visible.
func TestTxnFencedRelayStops(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"publish", "commit"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			b := newTxnBroker()
			p := b.producer()
			const total = 30
			successor := b.producer()
			r := relayOn(t, pg, p, func(_ *forwarder.Config, c *pglog.Config) {
				c.FlushRows, c.FlushInterval = total, time.Hour
			})
			if at == "publish" {
				p.afterPublish = func(n int) {
					if n == 10 {
						_, _ = successor.Recover(context.Background())
					}
				}
			} else {
				// The last row fills the transaction: its commit comes next, after the takeover.
				p.afterPublish = func(n int) {
					if n == total {
						_, _ = successor.Recover(context.Background())
					}
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			select {
			case <-r.Reading():
			case err := <-done:
				t.Fatalf("relay ended before reading its slot: %v", err)
			}
			writeKeys(t, pg, 3, 10, 3)
			select {
			case err := <-done:
				if !outboxkit.IsFenced(err) {
					t.Fatalf("Run returned %v, want an error marked Fenced", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the fenced relay still runs after 20s")
			}
			if n := b.visible(); n != 0 {
				t.Errorf("%d events of the fenced relay visible", n)
			}
			if n := outboxRows(t, pg); n != total {
				t.Errorf("%d rows left, want all %d: the fenced relay removed rows", n, total)
			}
		})
	}
}

// A row the broker refuses inside a transaction aborts it — the refused record may be in it all
// the same — and the other rows it held go again in the next one and are committed once, in
// order; the refused row backs off and is dead-lettered without ever becoming visible.
func TestTxnFailedRowAbortsItsTransaction(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	b := newTxnBroker()
	p := b.producer()
	p.fail = func(m *message.Message) error {
		if m.Metadata.Get(outboxkit.MetadataPartitionKey) == "bad" {
			return errors.New("message too large")
		}
		return nil
	}
	r := relayOn(t, pg, p, func(f *forwarder.Config, c *pglog.Config) {
		f.MaxAttempts = 3
		c.FlushInterval = 200 * time.Millisecond
	})
	run(t, r)
	var good []string
	good = append(good, writeKeys(t, pg, 6, 5, 3)...)
	bad := write(t, pg, "bad", 1)
	good = append(good, writeKeys(t, pg, 6, 5, 3)...)
	testenv.Eventually(t, 20*time.Second, "the other keys' events committed", func() bool { return b.has(good) })
	testenv.Eventually(t, 10*time.Second, "the refused event dead-lettered after 3 attempts", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND attempts = 3 AND uuid = $1::uuid`, bad[0]) == 1
	})
	testenv.Eventually(t, 10*time.Second, "the outbox down to the dead letter", func() bool { return outboxRows(t, pg) == 1 })
	b.checkExactlyOnce(t, good)
	b.mu.Lock()
	aborts := b.aborts
	b.mu.Unlock()
	if aborts < 3 {
		t.Errorf("%d transactions aborted, want one per failed attempt (3)", aborts)
	}
}

// A relay that dies in its first backfill, after a commit, while writers go on: its successor
// makes the slot again with a snapshot (the table as it stands, read without one, would overlap
// the log), skips the rows the broker has and publishes every other event once — those committed
// after the first slot was made included, which the first slot's log carried too.
func TestTxnInterruptedBackfillPublishesNothingTwice(t *testing.T) {
	t.Parallel()
	pg := testenv.NewLogicalPG(t)
	b := newTxnBroker()
	ids := writeKeys(t, pg, 30, 10, 7)

	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	written := make(chan struct{})
	p := b.producer()
	p.afterPublish = func(n int) {
		if n == 1 {
			<-written // the first transaction commits only after the writers below
		}
	}
	dead := relayOn(t, pg, p, func(_ *forwarder.Config, c *pglog.Config) {
		c.FlushRows, c.FlushInterval, c.StatusInterval = 40, time.Hour, time.Hour
	})
	pglog.CrashOnStop(dead)
	pglog.AfterCommit(dead, kill)
	done := make(chan error, 1)
	go func() { done <- dead.Run(ctx) }()
	testenv.Eventually(t, 20*time.Second, "the relay's slot made", func() bool {
		return pg.Int(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, dead.SlotName()) == 1
	})
	later := writeKeys(t, pg, 5, 10, 5)
	close(written)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := b.visible(); n < 40 || n >= len(ids) {
		t.Fatalf("%d events committed before the crash, want one transaction's", n)
	}

	run(t, relayOn(t, pg, b.producer(), nil))
	all := append(ids, later...)
	testenv.Eventually(t, 20*time.Second, "every event committed", func() bool { return b.has(all) })
	testenv.Eventually(t, 10*time.Second, "the outbox empty", func() bool { return outboxRows(t, pg) == 0 })
	// The writers after the slot wrote while the first relay's log was read: wait for its replay
	// to have had the chance to come (the slot is read past them).
	end := pg.Int(t, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	testenv.Eventually(t, 10*time.Second, "the slot read past the writes", func() bool {
		return pg.Int(t, `SELECT coalesce((confirmed_flush_lsn - '0/0')::bigint, 0) FROM pg_replication_slots WHERE slot_name = $1`, dead.SlotName()) >= end
	})
	b.checkExactlyOnce(t, all)
}

// Relays killed one after another at random points — after a commit before its checkpoint, with
// a transaction open, at a random instant (in their start and recovery too) — while a writer
// goes on: the committed transactions hold every event exactly once, each key in order. With a
// key the broker refuses (its refused records landing in the transaction all the same), none of
// its events is ever visible: they are dead-lettered, or parked behind the first one.
func TestTxnRelaysKilledAtRandomPointsExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		wal, park bool
		refused   bool
	}{
		{name: "table"},
		{name: "wal", wal: true},
		{name: "table, a refused key", refused: true},
		{name: "table, a refused key parked", refused: true, park: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewLogicalPG(t)
			b := newTxnBroker()
			tune := func(f *forwarder.Config, c *pglog.Config) {
				f.MaxAttempts, f.ParkKeyOnDeadLetter = 2, tc.park
				if tc.wal {
					walMode(f, c)
				}
			}
			const events, keys = 1200, 12
			key := func(i int) string {
				if tc.refused && i%10 == 3 {
					return "refused"
				}
				return fmt.Sprintf("k%d", i%keys)
			}
			var writeEvent func(i int) string
			if tc.wal {
				st := walStore(t, pg)
				// WAL mode needs the slot before the first write.
				if err := run(t, relayOn(t, pg, b.producer(), tune))(); err != nil {
					t.Fatal(err)
				}
				writeEvent = func(i int) string {
					id, err := transact(st, key(i))
					if err != nil {
						t.Error(err)
					}
					return id
				}
			} else {
				writeEvent = func(i int) string { return write(t, pg, key(i), 1)[0] }
			}
			var (
				mu      sync.Mutex
				good    []string
				refused int
			)
			add := func(i int, id string) {
				mu.Lock()
				defer mu.Unlock()
				if key(i) == "refused" {
					refused++
				} else {
					good = append(good, id)
				}
			}
			for i := range events / 4 { // some before the first relay: a backfill in table mode
				add(i, writeEvent(i))
			}
			wrote := make(chan struct{})
			go func() {
				defer close(wrote)
				for i := events / 4; i < events; i++ {
					add(i, writeEvent(i))
				}
			}()

			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			byPoint := map[string]int{}
			producer := func() *txnProducer {
				p := b.producer()
				p.fail = func(m *message.Message) error {
					if m.Metadata.Get(outboxkit.MetadataPartitionKey) == "refused" {
						return errors.New("message too large")
					}
					return nil
				}
				return p
			}
			for kill := 0; kill < 40; kill++ {
				ctx, cancel := context.WithCancel(context.Background())
				p := producer()
				r := relayOn(t, pg, p, func(f *forwarder.Config, c *pglog.Config) {
					tune(f, c)
					c.FlushRows, c.FlushInterval = 10+rng.IntN(40), time.Duration(5+rng.IntN(40))*time.Millisecond
					c.StatusInterval = time.Duration(5+rng.IntN(200)) * time.Millisecond
				})
				pglog.CrashOnStop(r)
				point := []string{"after_commit", "txn_open", "instant"}[rng.IntN(3)]
				byPoint[point]++
				switch point {
				case "after_commit":
					n, at := 0, 1+rng.IntN(3)
					pglog.AfterCommit(r, func() {
						if n++; n == at {
							cancel()
						}
					})
				case "txn_open":
					at := 1 + rng.IntN(60)
					p.afterPublish = func(n int) {
						if n == at {
							cancel()
						}
					}
				}
				timer := time.AfterFunc(time.Duration(rng.IntN(300))*time.Millisecond+50*time.Millisecond, cancel)
				// A kill in the start's checks ends them with the context's error.
				if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
					t.Fatalf("relay %d: %v", kill, err)
				}
				timer.Stop()
				cancel()
			}
			<-wrote
			run(t, relayOn(t, pg, producer(), tune))
			mu.Lock()
			all := append([]string(nil), good...)
			mu.Unlock()
			testenv.Eventually(t, 60*time.Second, "every event committed", func() bool { return b.has(all) })
			if !tc.wal {
				testenv.Eventually(t, 20*time.Second, "the outbox down to the refused key's events", func() bool {
					return outboxRows(t, pg) == refused &&
						pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE partition_key = 'refused'`) == refused
				})
			}
			b.checkExactlyOnce(t, all)
			b.mu.Lock()
			t.Logf("%d events, %d refused, 40 relays killed %v, %d commits, %d aborts", len(all), refused, byPoint, b.commits, b.aborts)
			b.mu.Unlock()
		})
	}
}
