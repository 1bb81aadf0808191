package pgxstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// feed hands out what the test puts in, all at once.
type feed chan *message.Message

func (f feed) Subscribe(context.Context, string) (<-chan *message.Message, error) { return f, nil }
func (f feed) Close() error                                                       { return nil }
func (f feed) Unacked() int                                                       { return cap(f) }

// runBatch runs a batch consumer over msgs, handed out at once, until each is settled, and
// returns the nacked ones.
func runBatch(t *testing.T, e *transactEnv, h message.HandlerFunc, msgs []*message.Message) (nacked []string) {
	t.Helper()
	f := make(feed, len(msgs))
	for _, m := range msgs {
		m.SetContext(outboxkit.WithRedelivered(context.Background(), false))
		f <- m
	}
	c, err := middleware.NewBatchConsumer(middleware.BatchConfig{StackConfig: middleware.StackConfig{
		Store: e.store, Consumer: "billing", MaxRetries: -1,
		RetryBackoff: outboxkit.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Multiplier: 1},
	}, MaxBatch: 100}, f, "orders", h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for _, m := range msgs {
		select {
		case <-m.Acked():
		case <-m.Nacked():
			nacked = append(nacked, m.UUID)
		case <-time.After(20 * time.Second):
			t.Fatalf("message %s neither acked nor nacked", m.UUID)
		}
	}
	return nacked
}

// insertOrder is a handler writing one order per message in the batch's transaction.
func (e *transactEnv) insertOrder(msg *message.Message) ([]*message.Message, error) {
	tx, ok, err := outboxkit.TxFrom[pgx.Tx](msg.Context())
	if !ok || err != nil {
		return nil, fmt.Errorf("no pgx.Tx in the handler's context (%v)", err)
	}
	_, err = tx.Exec(msg.Context(), `INSERT INTO `+e.pg.Schema.Ident()+`.orders (id) VALUES ($1)`, msg.UUID)
	return nil, err
}

func keyed(ids ...string) []*message.Message {
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		msgs[i] = message.NewMessage(id, []byte(`{}`))
		outboxkit.SetPartitionKey(msgs[i], "k-"+id)
	}
	return msgs
}

// The batch's transaction costs, besides its handlers' statements, two round trips: BEGIN goes
// with the inbox INSERT, then COMMIT.
func TestBatchConsumerBeginsWithTheInboxRows(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	_ = e.wire.take()
	msgs := keyed("a-1", "a-2", "a-3", "a-4", "a-5")
	if nacked := runBatch(t, e, e.insertOrder, msgs); len(nacked) > 0 {
		t.Fatalf("nacked %v", nacked)
	}
	sent := e.wire.take()
	begin := -1
	for i, s := range sent {
		if strings.HasPrefix(s, "begin") || strings.HasPrefix(s, "batch[begin") {
			begin = i
			break
		}
	}
	if begin < 0 {
		t.Fatalf("sent %q: no transaction", sent)
	}
	tx := sent[begin:]
	if len(tx) > len(msgs)+2 {
		tx = tx[:len(msgs)+3]
	}
	if len(tx) != len(msgs)+2 || !strings.HasPrefix(tx[0], "batch[begin + ") || tx[len(tx)-1] != "commit" {
		t.Fatalf("the batch's transaction sent %q; want BEGIN and the inbox INSERT in one round trip, the %d handlers' INSERTs, COMMIT",
			tx, len(msgs))
	}
	if n := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`); n != len(msgs) {
		t.Fatalf("%d orders, want %d", n, len(msgs))
	}
	if n := e.pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox WHERE consumer = 'billing'`); n != len(msgs) {
		t.Fatalf("%d inbox rows, want %d", n, len(msgs))
	}
	e.reused(t, 1)
}

// The handler's pgx.Tx is a transaction like any other: savepoints (Begin) commit and roll back
// their part alone, Conn is the session's; and a batch that fails rolls back and gives its
// connection back to the pool in a state the pool keeps.
func TestBatchConsumerTxIsAPgxTx(t *testing.T) {
	t.Parallel()
	e := newTransactEnv(t, pgxstore.Config{})
	ctx := context.Background()
	orders := e.pg.Schema.Ident() + ".orders"
	var ran []string    // only Run's goroutine appends, and the test reads after every message settled
	var leftOpen pgx.Tx // a savepoint of the batch's transaction, left open when the batch ends
	h := func(msg *message.Message) ([]*message.Message, error) {
		ran = append(ran, msg.UUID)
		tx, _, err := outboxkit.TxFrom[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		if msg.UUID == "b-2" && leftOpen == nil {
			if leftOpen, err = tx.Begin(ctx); err != nil {
				return nil, err
			}
		}
		if tx.Conn() == nil || tx.Conn().PgConn().TxStatus() != 'T' {
			return nil, errors.New("the handler's transaction is not open on its connection")
		}
		for _, keep := range []bool{false, true} {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO `+orders+` (id, ref) VALUES ($1, $2)`, fmt.Sprintf("%s/%v", msg.UUID, keep), msg.UUID); err != nil {
				return nil, err
			}
			if keep {
				err = sp.Commit(ctx)
			} else {
				err = sp.Rollback(ctx)
			}
			if err != nil {
				return nil, err
			}
			if err := sp.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				return nil, fmt.Errorf("a savepoint committed twice: %v, want ErrTxClosed", err)
			}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+orders+` WHERE ref = $1`, msg.UUID).Scan(&n); err != nil || n != 1 {
			return nil, fmt.Errorf("%d rows after a savepoint rolled back and one committed (%v), want 1", n, err)
		}
		if msg.UUID == "b-1" { // large objects work in it, as in pgx's own transactions
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return nil, fmt.Errorf("create a large object: %w", err)
			}
			obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite)
			if err != nil {
				return nil, err
			}
			if _, err := obj.Write([]byte("receipt")); err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `UPDATE `+orders+` SET ref = $1 WHERE id = $2`, fmt.Sprint(oid), "b-1/true"); err != nil {
				return nil, err
			}
		}
		if msg.UUID == "b-3" {
			return nil, errors.New("a transient failure") // the batch rolls back; each message then runs alone
		}
		return nil, nil
	}
	if nacked := runBatch(t, e, h, keyed("b-1", "b-2", "b-3")); strings.Join(nacked, ",") != "b-3" {
		t.Fatalf("nacked %v, want b-3 alone", nacked)
	}
	// The batch ran all three, then, after b-3 failed, each alone: a failure of the batch's own
	// transaction would have sent them alone before b-3.
	if strings.Join(ran, ",") != "b-1,b-2,b-3,b-1,b-2,b-3" {
		t.Fatalf("the handler ran %v, want the batch of three and then each alone", ran)
	}
	// Its transaction ended, a savepoint refuses statements, as pgx's do.
	if _, err := leftOpen.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("a statement in a savepoint of a transaction that ended: %v, want ErrTxClosed", err)
	}
	rows, _ := e.pg.Pool.Query(ctx, `SELECT id FROM `+orders+` ORDER BY id`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "b-1/true,b-2/true" {
		t.Fatalf("committed %v, want b-1/true,b-2/true", got)
	}
	var receipt []byte
	if err := e.pg.Pool.QueryRow(ctx, `SELECT lo_get(ref::oid) FROM `+orders+` WHERE id = 'b-1/true'`).Scan(&receipt); err != nil ||
		string(receipt) != "receipt" {
		t.Fatalf("large object %q (%v), want the one the handler wrote", receipt, err)
	}
	if st := e.store.Pool().Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still held after the consumer stopped", st.AcquiredConns())
	}
	if _, err := e.store.Pool().Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("the pool no longer works: %v", err)
	}
}
