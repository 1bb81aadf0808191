package mysqlbinlog_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// purgeBinaryLogs rotates the server's binary log and purges every file but the new one, so that
// no checkpoint written before is in the log any more. The relays reading the log must be stopped:
// the server keeps a file a replica still reads. (It runs in tests that do not call t.Parallel:
// no other test of the package reads the log meanwhile.)
func purgeBinaryLogs(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec("FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	logs := binaryLogs(t, db)
	newest := logs[len(logs)-1]
	var purgeErr error
	if !testenv.Within(30*time.Second, func() bool {
		// Refused, or stopped short, while a replica that went away still has the file open: the
		// server's dump thread notices the closed connection at its next write.
		_, purgeErr = db.Exec("PURGE BINARY LOGS TO '" + newest + "'")
		logs = binaryLogs(t, db)
		return len(logs) == 1 && logs[0] == newest
	}) {
		t.Fatalf("the binary logs are %v after PURGE BINARY LOGS TO '%s' (last error: %v)", logs, newest, purgeErr)
	}
}

func binaryLogs(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		names = append(names, string(vals[0]))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// checkpointFile is the binary log file of the relay group's checkpoint.
func (o *outbox) checkpointFile(t *testing.T) string {
	t.Helper()
	var file string
	if err := o.db.QueryRow(`SELECT file FROM binlog_relays WHERE name = ?`, forwarder.DefaultName).Scan(&file); err != nil {
		t.Fatal(err)
	}
	return file
}

// recoveryLogged returns the error-level line of a recovery, whose fields name the lost position
// and the one the relay goes on from.
func recoveryLogged(logger *watermill.CaptureLoggerAdapter) (watermill.CapturedMessage, bool) {
	for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
		if strings.Contains(m.Msg, "recovering") {
			return m, true
		}
	}
	return watermill.CapturedMessage{}, false
}

// Binary logs purged while the relay was down — its checkpoint's file and GTID gone — are
// recovered from: the relay reads the rows left in the outbox, then the log from its end. Every
// row arrives: the rows it published before its crash and had not removed yet (the only ones that
// arrive twice), the rows written meanwhile in transactions with other tables' writes, a dead
// letter replayed meanwhile, and the rows written after; no rolled-back row does; the outbox ends
// empty, and the recovery is logged, naming the lost position, and counted.
func TestPurgedBinaryLogsAreRecoveredFromTheTable(t *testing.T) {
	for _, filePos := range []bool{false, true} {
		t.Run("FilePosition="+strconv.FormatBool(filePos), func(t *testing.T) {
			o := newOutbox(t)
			if _, err := o.db.Exec(`CREATE TABLE other (id INT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64)) ENGINE = InnoDB`); err != nil {
				t.Fatal(err)
			}
			var refuse atomic.Bool
			refuse.Store(true)
			pub := newRecorder()
			pub.fail = func(m *message.Message) bool { return refuse.Load() && string(m.Payload) == "dead:0" }
			// Checkpoints every 20 rows: some rows published after the last one when it crashes.
			r := relayOn(t, o, pub, func(f *forwarder.Config, c *mysqlbinlog.Config) {
				c.FilePosition, c.FlushInterval, c.FlushRows, f.BatchSize, f.MaxAttempts = filePos, time.Hour, 20, 7, 1
			})
			mysqlbinlog.CrashOnStop(r)
			stop := run(t, r)
			dead := o.write(t, "dead", 1)
			var before []string
			for i := range 10 {
				before = append(before, o.writeFrom(t, "k"+strconv.Itoa(i%3), i*5, 5)...)
			}
			testenv.Eventually(t, 10*time.Second, "the rows to arrive", func() bool { return pub.has(before) })
			testenv.Eventually(t, 10*time.Second, "the refused row to be dead-lettered", func() bool {
				return o.count(t, "uuid = ? AND dead_lettered_at IS NOT NULL", dead[0]) == 1
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			left := map[string]bool{} // published, not removed by a checkpoint before the crash
			for _, id := range o.ids(t) {
				if id != dead[0] {
					left[id] = true
				}
			}
			if len(left) == 0 || len(left) == len(before) {
				t.Fatalf("%d of %d rows left after the crash: want some checkpointed and some not (FlushRows 20)", len(left), len(before))
			}

			// While the relay is down: rows in transactions with other tables' writes, a rolled-back
			// one, other tables' transactions alone, the dead letter replayed; then the binary logs
			// purged.
			var down, rolledBack []string
			ctx := context.Background()
			for i := range 6 {
				tx, err := o.db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(`INSERT INTO other (note) VALUES (?)`, "before "+strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
				ids := o.insert(t, tx, "k"+strconv.Itoa(i%3), 50+i*3, 3)
				if _, err := tx.Exec(`INSERT INTO other (note) VALUES (?)`, "after "+strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
				if i == 4 {
					if err := tx.Rollback(); err != nil {
						t.Fatal(err)
					}
					rolledBack = append(rolledBack, ids...)
					continue
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				down = append(down, ids...)
				if _, err := o.db.Exec(`UPDATE other SET note = CONCAT(note, '.')`); err != nil {
					t.Fatal(err)
				}
			}
			refuse.Store(false)
			if replayed, err := o.store.ReplayOutboxDeadLetters(ctx, store.DeadLetterFilter{All: true}); err != nil || len(replayed) != 1 {
				t.Fatalf("replay: %v, %d rows", err, len(replayed))
			}
			lostFile := o.checkpointFile(t)
			purgeBinaryLogs(t, o.db)
			for _, f := range binaryLogs(t, o.db) {
				if f == lostFile {
					t.Fatalf("the checkpoint's file %s is still in the binary logs", lostFile)
				}
			}

			logger := watermill.NewCaptureLogger()
			r = relayOn(t, o, pub, func(f *forwarder.Config, c *mysqlbinlog.Config) { c.FilePosition, f.Logger = filePos, logger })
			stop = run(t, r)
			// Counted once its checkpoint is written (backfilled 0): backfilled 1 read after is the
			// end of its reading of the table. Rows written from then on are in the log alone.
			testenv.Eventually(t, 10*time.Second, "the relay to recover and publish what it found in the outbox", func() bool {
				if mysqlbinlog.Recoveries(r) == 0 {
					return false
				}
				var backfilled int
				if err := o.db.QueryRow(`SELECT backfilled FROM binlog_relays`).Scan(&backfilled); err != nil {
					t.Fatal(err)
				}
				return backfilled == 1
			})
			after := o.writeFrom(t, "k0", 100, 4)
			all := append(append(append(append([]string{}, before...), down...), after...), dead...)
			testenv.Eventually(t, 10*time.Second, "every row to arrive", func() bool { return pub.has(all) })
			testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			for id, n := range pub.duplicated() {
				if !left[id] || n != 2 {
					t.Errorf("row %s arrived %d times: only a row published after the last checkpoint before the crash may arrive twice", id, n)
				}
			}
			for _, id := range rolledBack {
				if n := pub.count(id); n != 0 {
					t.Errorf("rolled-back row %s arrived %d times", id, n)
				}
			}
			if n := pub.count(dead[0]); n != 1 {
				t.Errorf("the dead letter replayed while the relay was down arrived %d times, want once", n)
			}
			if n := mysqlbinlog.Recoveries(r); n != 1 {
				t.Errorf("%d recoveries counted, want 1", n)
			}
			m, ok := recoveryLogged(logger)
			if !ok {
				t.Fatalf("no recovery logged at error level; logged: %v", logger.Captured()[watermill.ErrorLogLevel])
			}
			if lost, _ := m.Fields["lost"].(string); !strings.Contains(lost, lostFile) || m.Err == nil || m.Fields["recoveries"] != int64(1) {
				t.Errorf("recovery logged as %q %v (error %v): want the lost position (in %s), the server's error and the count", m.Msg, m.Fields, m.Err, lostFile)
			}
			if f := o.checkpointFile(t); f == lostFile {
				t.Errorf("the checkpoint is still in the purged file %s", f)
			}
			t.Logf("%d rows, %d left at the crash and published again; the recovery: %v (%v)", len(all), len(pub.duplicated()), m.Fields, m.Err)
		})
	}
}

// A row backing off when the relay stopped keeps its recorded attempts through a recovery from
// purged binary logs: it is tried once more (its third attempt) and dead-lettered, not tried
// MaxAttempts times over.
func TestABackingOffRowKeepsItsAttemptsThroughARecovery(t *testing.T) {
	o := newOutbox(t)
	var refusals atomic.Int64
	pub := newRecorder()
	pub.fail = func(m *message.Message) bool {
		if string(m.Payload) != "bad:0" {
			return false
		}
		refusals.Add(1)
		return true
	}
	// The second attempt 100ms after the first, the third a second after it: the relay stops in
	// between.
	tune := func(f *forwarder.Config, _ *mysqlbinlog.Config) {
		f.MaxAttempts = 3
		f.Backoff = forwarder.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 10}
	}
	stop := run(t, relayOn(t, o, pub, tune))
	bad := o.write(t, "bad", 1)
	testenv.Eventually(t, 10*time.Second, "two failed attempts to be recorded", func() bool {
		return o.count(t, "uuid = ? AND attempts = 2 AND next_attempt_at IS NOT NULL", bad[0]) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := refusals.Load(); n != 2 {
		t.Fatalf("%d attempts before the stop, want 2", n)
	}
	down := o.write(t, "good", 3)
	purgeBinaryLogs(t, o.db)

	r := relayOn(t, o, pub, tune)
	stop = run(t, r)
	testenv.Eventually(t, 10*time.Second, "the third attempt to dead-letter the row", func() bool {
		return o.count(t, "uuid = ? AND attempts = 3 AND dead_lettered_at IS NOT NULL", bad[0]) == 1
	})
	testenv.Eventually(t, 10*time.Second, "the rows written while down to arrive", func() bool { return pub.has(down) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := mysqlbinlog.Recoveries(r); n != 1 {
		t.Errorf("%d recoveries, want 1", n)
	}
	if n := refusals.Load(); n != 3 {
		t.Errorf("the row was tried %d times in all, want MaxAttempts (3): its attempts did not survive the recovery", n)
	}
}

// A checkpoint the server does not have — a GTID beyond its own (the server is another one than
// the checkpoint's: a failover to a replica that was behind, a restore), a file it never wrote, a
// position past its file's end — is recovered from as purged binary logs are: the rows waiting in
// the outbox arrive, then the log's.
func TestACheckpointTheServerDoesNotHaveIsRecoveredFrom(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		filePos bool
		set     string // what the checkpoint is made to say
	}{
		{"GTID beyond the server's", false, ""}, // the server's own GTID, far ahead: gtidBeyond
		{"a file the server never wrote", true, "file = 'mariadb-bin.999999', pos = 4"},
		{"a position past the file's end", true, "pos = pos + 100000000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := newOutbox(t)
			if c.set == "" {
				c.set = gtidBeyond(t, o)
			}
			pub := newRecorder()
			tune := func(_ *forwarder.Config, cfg *mysqlbinlog.Config) { cfg.FilePosition = c.filePos }
			stop := run(t, relayOn(t, o, pub, tune))
			first := o.write(t, "a", 2)
			testenv.Eventually(t, 10*time.Second, "the first rows to arrive", func() bool { return pub.has(first) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if _, err := o.db.Exec("UPDATE binlog_relays SET " + c.set); err != nil {
				t.Fatal(err)
			}
			waiting := o.writeFrom(t, "a", 2, 3)

			r := relayOn(t, o, pub, tune)
			stop = run(t, r)
			testenv.Eventually(t, 10*time.Second, "the rows waiting to arrive", func() bool { return pub.has(waiting) })
			later := o.writeFrom(t, "a", 5, 2)
			testenv.Eventually(t, 10*time.Second, "the later rows to arrive", func() bool { return pub.has(later) })
			testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { return o.count(t, "1") == 0 })
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if n := mysqlbinlog.Recoveries(r); n != 1 {
				t.Errorf("%d recoveries, want 1", n)
			}
		})
	}
}

// A refusal no recovery fixes — the server refusing the log from its own end, or again from where
// a recovery started the relay — stops Run with an error saying so, instead of recovering again
// and again.
func TestARefusalNoRecoveryFixesStopsTheRelay(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	r := relayOn(t, o, newRecorder(), nil)
	mysqlbinlog.RefuseLog(r)
	err := runErr(t, r)
	if err == nil || !strings.Contains(err.Error(), "cannot fix it") {
		t.Fatalf("Run returned %v, want the refusal no recovery fixes", err)
	}
	if n := mysqlbinlog.Recoveries(r); n > 1 {
		t.Errorf("%d recoveries before the relay stopped, want at most 1", n)
	}
}

// gtidBeyond is the assignment that makes a checkpoint's GTID set run far past the server's own
// GTIDs, in the server's flavour: MariaDB's domain-server-sequence, MySQL's uuid:interval. A MySQL
// server without GTIDs fails the test: the relay tracks it by file, and no GTID case applies.
func gtidBeyond(t *testing.T, o *outbox) string {
	t.Helper()
	if isMariaDB(t, o) {
		return "gtid_set = CONCAT(@@gtid_domain_id, '-', @@server_id, '-4000000000')"
	}
	var mode string
	if err := o.db.QueryRow("SELECT @@GLOBAL.gtid_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "ON" {
		t.Fatalf("the test server is MySQL with gtid_mode = %s: run the binlog relay's tests on a server with GTIDs (MariaDB, or MySQL with gtid_mode = ON)", mode)
	}
	return "gtid_set = CONCAT(@@server_uuid, ':1-4000000000')"
}
