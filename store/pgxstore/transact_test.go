package pgxstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// wire records what a pool sends to Postgres: each query on its own, each batch as one entry.
type wire struct {
	mu   sync.Mutex
	sent []string
}

func (w *wire) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = append(w.sent, s)
}

func (w *wire) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.sent
	w.sent = nil
	return s
}

func (w *wire) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	w.add(firstWords(d.SQL))
	return ctx
}

func (w *wire) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *wire) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var parts []string
	for _, q := range d.Batch.QueuedQueries {
		parts = append(parts, firstWords(q.SQL))
	}
	w.add("batch[" + strings.Join(parts, " + ") + "]")
	return ctx
}

func (w *wire) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (w *wire) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// firstWords names a statement by its first three words ("INSERT INTO x", "commit").
func firstWords(sql string) string {
	f := strings.Fields(sql)
	return strings.Join(f[:min(3, len(f))], " ")
}

// transactEnv is a migrated schema with a business table, and a store whose pool records what it
// sends.
type transactEnv struct {
	pg    *testenv.PG
	store *pgxstore.Store
	wire  *wire
}

func newTransactEnv(t *testing.T, cfg pgxstore.Config, mode ...pgx.QueryExecMode) *transactEnv {
	t.Helper()
	ctx := context.Background()
	pg := testenv.NewPG(t)
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE `+pg.Schema.Ident()+`.orders (id text PRIMARY KEY,
		ref text UNIQUE DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{}
	pcfg.ConnConfig.Tracer = w
	if len(mode) > 0 {
		pcfg.ConnConfig.DefaultQueryExecMode = mode[0]
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Schema = string(pg.Schema)
	s, err := pgxstore.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &transactEnv{pg: pg, store: s, wire: w}
}

// placeOrder is a business change and its event.
func (e *transactEnv) placeOrder(id, ref string, events ...*message.Message) func(pgx.Tx, *pipeline.Publisher) error {
	return func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if _, err := tx.Exec(context.Background(), `INSERT INTO `+e.pg.Schema.Ident()+`.orders (id, ref) VALUES ($1, $2)`, id, ref); err != nil {
			return err
		}
		return pub.Publish("orders", events...)
	}
}

// state is what committed: the orders' ids and the outbox's message ids, in relay order.
func (e *transactEnv) state(t *testing.T) (orders, outbox []string) {
	t.Helper()
	ctx := context.Background()
	rows, _ := e.pg.Pool.Query(ctx, `SELECT id FROM `+e.pg.Schema.Ident()+`.orders ORDER BY id`)
	orders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	rows, _ = e.pg.Pool.Query(ctx, `SELECT coalesce(uuid_text, uuid::text) FROM `+e.pg.Schema.Ident()+`.outbox ORDER BY seq`)
	outbox, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return orders, outbox
}

// reused checks that every Transact gave its connection back to the pool in a state the pool
// keeps (outside any transaction): the pool dials a new one only when it had to close one. The
// tests run their transactions one at a time, so want is 1, or one more per session a test kills.
func (e *transactEnv) reused(t *testing.T, want int64) {
	t.Helper()
	if got := e.store.Pool().Stat().NewConnsCount(); got != want {
		t.Fatalf("the pool opened %d connections, want %d: a Transact left its session unusable or inside a transaction", got, want)
	}
	if _, err := e.store.Pool().Exec(context.Background(), `SELECT 1`); err != nil {
		t.Fatalf("the pool no longer works: %v", err)
	}
}

func TestTransactSendsTheRowsWithTheCommit(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	notified := listenForWakeUps(t, e.pg)
	first, second := pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{"n":1}`)), pipeline.NewEvent("OrderPriced", "o-1", []byte(`{"n":2}`))
	_ = e.wire.take()
	if err := e.store.Transact(context.Background(), pgx.TxOptions{}, e.placeOrder("o-1", "r-1", first, second)); err != nil {
		t.Fatal(err)
	}
	sent := e.wire.take()
	want := []string{"begin", "INSERT INTO " + e.pg.Schema.Ident() + ".orders", "batch[WITH inserted AS + commit]"}
	if strings.Join(sent, " | ") != strings.Join(want, " | ") {
		t.Fatalf("sent %q, want %q: the outbox INSERT must travel in one round trip with the COMMIT", sent, want)
	}
	orders, outbox := e.state(t)
	if strings.Join(orders, ",") != "o-1" || strings.Join(outbox, ",") != first.UUID+","+second.UUID {
		t.Fatalf("committed orders %v and outbox %v; want [o-1] and [%s %s] in order", orders, outbox, first.UUID, second.UUID)
	}
	if !notified(10 * time.Second) {
		t.Fatal("no wake-up after the commit")
	}
	e.reused(t, 1)
}

func TestTransactWithoutNotifyAndWithoutEvents(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{DisableNotify: true})
	ctx := context.Background()
	ev := pipeline.NewEvent("OrderPlaced", "o-1", nil)
	if err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-1", "r-1", ev)); err != nil {
		t.Fatal(err)
	}
	if sent := e.wire.take(); sent[len(sent)-1] != "batch[INSERT INTO "+e.pg.Schema.Ident()+".outbox + commit]" {
		t.Fatalf("sent %q; want the plain INSERT with the commit last", sent)
	}
	// The caller's own commit statement is the one sent.
	opts := pgx.TxOptions{BeginQuery: "BEGIN ISOLATION LEVEL REPEATABLE READ", CommitQuery: "COMMIT AND NO CHAIN"}
	ev2 := pipeline.NewEvent("OrderPlaced", "o-3", nil)
	if err := e.store.Transact(ctx, opts, e.placeOrder("o-3", "r-3", ev2)); err != nil {
		t.Fatal(err)
	}
	if sent := e.wire.take(); sent[0] != "BEGIN ISOLATION LEVEL" || sent[len(sent)-1] != "batch[INSERT INTO "+e.pg.Schema.Ident()+".outbox + COMMIT AND NO]" {
		t.Fatalf("sent %q; want the caller's BEGIN and COMMIT", sent)
	}
	// A transaction that publishes nothing commits as any other.
	if err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-2", "r-2")); err != nil {
		t.Fatal(err)
	}
	if sent := e.wire.take(); sent[len(sent)-1] != "commit" {
		t.Fatalf("sent %q; want a plain commit last", sent)
	}
	orders, outbox := e.state(t)
	if strings.Join(orders, ",") != "o-1,o-2,o-3" || strings.Join(outbox, ",") != ev.UUID+","+ev2.UUID {
		t.Fatalf("committed orders %v and outbox %v", orders, outbox)
	}
	e.reused(t, 1)
}

// Every way pgx can send the pipeline (PgBouncer in transaction mode needs one of the last two)
// keeps the COMMIT behind the INSERT: one that fails — a message id already in the outbox, or twice
// in one transaction — skips it, and nothing commits.
func TestTransactInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := newTransactEnv(t, pgxstore.Config{}, mode)
			ctx := context.Background()
			var ids []string
			for range 2 { // the second time from the statement caches
				ev := pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{"n":1}`))
				if err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder(ev.UUID, ev.UUID, ev)); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, ev.UUID)
			}
			err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-dup", "r-dup", message.NewMessage(ids[1], nil)))
			if !errors.Is(err, pipeline.ErrDuplicateUUID) {
				t.Fatalf("Transact with a message id already in the outbox returned %v; want ErrDuplicateUUID", err)
			}
			twin := pipeline.NewEvent("OrderPlaced", "o-3", nil)
			err = e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-3", "r-3", twin, message.NewMessage(twin.UUID, nil)))
			if !errors.Is(err, pipeline.ErrDuplicateUUID) {
				t.Fatalf("Transact with one message id twice returned %v; want ErrDuplicateUUID", err)
			}
			orders, outbox := e.state(t)
			if len(orders) != 2 || strings.Join(outbox, ",") != strings.Join(ids, ",") {
				t.Fatalf("committed orders %v and outbox %v; want the two transactions that succeeded", orders, outbox)
			}
			e.reused(t, 1)
		})
	}
}

func TestTransactFailedCommitKeepsNothing(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	ctx := context.Background()
	if err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-1", "same", pipeline.NewEvent("OrderPlaced", "o-1", nil))); err != nil {
		t.Fatal(err)
	}
	// The unique ref is checked at COMMIT (deferred): the COMMIT sent with the rows fails.
	err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-2", "same", pipeline.NewEvent("OrderPlaced", "o-2", nil)))
	if err == nil || !strings.Contains(err.Error(), "orders_ref_key") {
		t.Fatalf("Transact returned %v; want the deferred unique violation at commit", err)
	}
	orders, outbox := e.state(t)
	if strings.Join(orders, ",") != "o-1" || len(outbox) != 1 {
		t.Fatalf("committed orders %v and %d outbox rows; the failed commit must keep nothing", orders, len(outbox))
	}
	e.reused(t, 1)
}

// The session dies before the pipeline reaches it: Transact says the database could not be
// reached, nothing is committed, and the pool goes on with a new connection.
func TestTransactOnALostSessionIsTransport(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	ctx := context.Background()
	err := e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if err := e.placeOrder("o-1", "r-1", pipeline.NewEvent("OrderPlaced", "o-1", nil))(tx, pub); err != nil {
			return err
		}
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		if _, err := e.pg.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return err
		}
		testenv.Eventually(t, 10*time.Second, "the terminated session to exit", func() bool {
			return e.pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
		})
		return nil
	})
	if !outboxkit.IsUnreachable(err) {
		t.Fatalf("Transact on a terminated session returned %v; want an error marked outboxkit.Unreachable", err)
	}
	if orders, outbox := e.state(t); len(orders) != 0 || len(outbox) != 0 {
		t.Fatalf("committed orders %v and outbox %v; the lost session must commit nothing", orders, outbox)
	}
	if err := e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-2", "r-2", pipeline.NewEvent("OrderPlaced", "o-2", nil))); err != nil {
		t.Fatalf("the next Transact failed: %v", err)
	}
	e.reused(t, 2) // the killed session's, and the one after it
}

func TestTransactRollsBackOnErrorPanicAndAbortedTx(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	ctx := context.Background()
	boom := errors.New("payment declined")
	err := e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if err := e.placeOrder("o-1", "r-1", pipeline.NewEvent("OrderPlaced", "o-1", nil))(tx, pub); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Transact returned %v; want fn's error", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "bug" {
				t.Fatalf("recovered %v; want fn's panic re-raised", r)
			}
		}()
		_ = e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
			_ = e.placeOrder("o-2", "r-2", pipeline.NewEvent("OrderPlaced", "o-2", nil))(tx, pub)
			panic("bug")
		})
	}()
	// fn swallowed a failed statement: the rows are not sent, the transaction is rolled back.
	err = e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if err := e.placeOrder("o-3", "r-3", pipeline.NewEvent("OrderPlaced", "o-3", nil))(tx, pub); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return nil
	})
	if !errors.Is(err, store.ErrTxAborted) {
		t.Fatalf("Transact after a failed statement returned %v; want ErrTxAborted", err)
	}
	// fn may not end the transaction.
	err = e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if err := e.placeOrder("o-4", "r-4", pipeline.NewEvent("OrderPlaced", "o-4", nil))(tx, pub); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if !errors.Is(err, pgxstore.ErrTxOwned) {
		t.Fatalf("Commit inside fn returned %v; want ErrTxOwned", err)
	}
	// Nor end it behind Transact's back: the rows would then commit on their own.
	err = e.store.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
		if err := pub.Publish("orders", pipeline.NewEvent("OrderPlaced", "o-9", nil)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ROLLBACK`)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "the transaction ended inside fn") {
		t.Fatalf("Transact after fn ended the transaction returned %v; want an error saying so", err)
	}
	// An invalid message is refused when it is published.
	err = e.store.Transact(ctx, pgx.TxOptions{}, e.placeOrder("o-5", "r-5", message.NewMessage("", nil)))
	var invalid *pipeline.InvalidMessageError
	if !errors.As(err, &invalid) {
		t.Fatalf("Transact with a message without id returned %v; want InvalidMessageError", err)
	}
	orders, outbox := e.state(t)
	if len(orders) != 0 || len(outbox) != 0 {
		t.Fatalf("committed orders %v and outbox %v; every transaction above must roll back", orders, outbox)
	}
	e.reused(t, 1)
}
