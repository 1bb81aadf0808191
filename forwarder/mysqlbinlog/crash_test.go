package mysqlbinlog_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// crashWriter commits outbox rows, one per transaction with a row of its own in table written,
// until stopped, riding out the server's outage: once the server answers again after a failed
// transaction, table written tells whether it committed after all (its commit's answer lost with
// the server); if not, the row is written again, under a new id.
type crashWriter struct {
	o    *outbox
	key  string
	next int

	mu           sync.Mutex
	committed    []string // the ids whose transaction the writer saw commit, or found committed
	notCommitted []string // the ids of transactions that failed and did not commit
	answersLost  int      // transactions that failed and committed
	commits      atomic.Int64
}

func (w *crashWriter) run(t *testing.T, stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		for {
			id := uuid.Must(uuid.NewV7()).String()
			err := w.write(ctx, id)
			if err != nil {
				var done bool
				if done, err = w.committedAfterAll(ctx, id); err != nil {
					t.Errorf("writer %s: %v", w.key, err)
					return
				}
				if !done {
					w.mu.Lock()
					w.notCommitted = append(w.notCommitted, id)
					w.mu.Unlock()
					continue
				}
				w.answersLost++
			}
			w.mu.Lock()
			w.committed = append(w.committed, id)
			w.mu.Unlock()
			w.commits.Add(1)
			w.next++
			break
		}
	}
}

// committedAfterAll waits for the server to answer and reads whether id's transaction, which
// failed, committed.
func (w *crashWriter) committedAfterAll(ctx context.Context, id string) (bool, error) {
	var n int
	if !testenv.Within(60*time.Second, func() bool {
		return w.o.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM written WHERE uuid = ?`, id).Scan(&n) == nil
	}) {
		return false, fmt.Errorf("the server did not answer within 60s of a failed write")
	}
	return n == 1, nil
}

func (w *crashWriter) write(ctx context.Context, id string) error {
	tx, err := w.o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	msg := store.OutboxMessage{UUID: id, Topic: "orders", PartitionKey: w.key, Payload: fmt.Appendf(nil, "%s:%d", w.key, w.next), Metadata: []byte("{}")}
	if err := w.o.store.UnwrapTx(tx).InsertOutbox(ctx, []store.OutboxMessage{msg}); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO written (uuid) VALUES (?)`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// The server killed with SIGKILL while the relay reads the log and writers write, then started
// again: the relay reconnects by itself and every committed row arrives; no row whose transaction
// did not commit does; the rows arriving twice are rows the outbox still held when the server came
// back, published after the last checkpoint; the outbox ends empty.
//
// The server runs with innodb_flush_log_at_trx_commit = 2 and sync_binlog = 0: a commit is in the
// operating system's files, not synced to disk. A crash of the server's process, as here, loses
// none of it (the operating system writes the files out); a crash of the machine could.
func TestTheRelayRidesOutAServerCrash(t *testing.T) {
	o := newOutbox(t)
	// After newOutbox: a server killed and not started again by a failing test is started before
	// the test's database is dropped.
	server := testenv.MySQLBinlogServer(t, serverURL(t))
	if _, err := o.db.Exec(`CREATE TABLE written (uuid CHAR(36) PRIMARY KEY) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	// The relay reaches the server through a proxy, so that the test can read what the outbox
	// holds when the server is back before the relay reads it.
	proxy, relayURL := testenv.ProxyURL(t, o.url)
	pub := newRecorder()
	r := relayOn(t, o, pub, func(f *forwarder.Config, c *mysqlbinlog.Config) {
		c.URL, c.FlushRows, f.BatchSize = relayURL, 50, 16
	})
	stop := run(t, r)

	writers := make([]*crashWriter, 3)
	stopWriting := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		writers[i] = &crashWriter{o: o, key: fmt.Sprintf("w%d", i)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			writers[i].run(t, stopWriting)
		}()
	}
	commits := func() int64 {
		var n int64
		for _, w := range writers {
			n += w.commits.Load()
		}
		return n
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stopWriting)
			wg.Wait()
		}
	}()
	testenv.Eventually(t, 30*time.Second, "rows to be published and checkpointed", func() bool {
		return pub.received() >= 100 && mysqlbinlog.Flushes(r) >= 2
	})

	server.Kill(t)
	proxy.Cut()
	killedAt := commits()
	server.Start(t)
	left := map[string]bool{} // the rows the outbox holds as the server comes back
	testenv.Eventually(t, 30*time.Second, "the outbox to be read after the restart", func() bool {
		ids, err := idsIn(o)
		for _, id := range ids {
			left[id] = true
		}
		return err == nil
	})
	proxy.Restore()
	testenv.Eventually(t, 30*time.Second, "the writers to commit again after the restart", func() bool { return commits() >= killedAt+60 })
	close(stopWriting)
	wg.Wait()
	stopped = true
	if t.Failed() {
		return
	}

	var committed []string
	for _, w := range writers {
		committed = append(committed, w.committed...)
	}
	inTable := map[string]bool{}
	rows, err := o.db.Query(`SELECT uuid FROM written`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		inTable[id] = true
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if len(inTable) != len(committed) {
		t.Fatalf("the writers confirmed %d commits, the server holds %d", len(committed), len(inTable))
	}
	testenv.Eventually(t, 30*time.Second, "every committed row to arrive", func() bool { return pub.has(committed) })
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	pub.mu.Lock()
	for id := range pub.seen {
		if !inTable[id] {
			t.Errorf("row %s arrived, and its transaction did not commit", id)
		}
	}
	pub.mu.Unlock()
	var notCommitted []string
	answersLost := 0
	for _, w := range writers {
		notCommitted = append(notCommitted, w.notCommitted...)
		answersLost += w.answersLost
	}
	for _, id := range notCommitted {
		if inTable[id] || pub.count(id) != 0 {
			t.Errorf("row %s, whose transaction failed and did not commit, is in the outbox's server (%v) or arrived (%d times)", id, inTable[id], pub.count(id))
		}
	}
	dup := pub.duplicated()
	for id, n := range dup {
		if !left[id] || n != 2 {
			t.Errorf("row %s arrived %d times: only a row still in the outbox when the server came back may arrive twice", id, n)
		}
	}
	t.Logf("%d rows committed (%d at the kill), %d transactions failed and did not commit, %d failed and committed, %d rows left in the outbox at the restart, %d published twice",
		len(committed), killedAt, len(notCommitted), answersLost, len(left), len(dup))
}

// idsIn lists the outbox's rows' ids, or says why it cannot.
func idsIn(o *outbox) ([]string, error) {
	rows, err := o.db.Query("SELECT uuid FROM outbox")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
