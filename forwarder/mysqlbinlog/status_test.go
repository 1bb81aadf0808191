package mysqlbinlog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
)

// readStatus is the one relay group of o, as a tool that runs no relay reads it.
func readStatus(t *testing.T, o *outbox) forwarder.BinlogStatus {
	t.Helper()
	all, err := mysqlbinlog.ReadStatus(context.Background(), o.db, o.database)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("ReadStatus: %d relay groups, want 1: %+v", len(all), all)
	}
	return all[0]
}

// A relay group's status: nothing before its first start; then its checkpoint as the table holds
// it, a reader while a relay holds the group's lock and none once it stops, the binary log
// written since the checkpoint across a rotation, a pause, a checkpoint whose file is purged — and
// for a user who may not list the binary logs, the rest with the GRANT that gives the lag.
func TestStatusShowsTheCheckpointItsReaderAndItsLag(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	ctx := context.Background()
	r := relayOn(t, o, newRecorder(), nil)
	if s, err := r.Status(ctx); err != nil || !s.CheckpointAt.IsZero() || s.Active || s.LagBytes != -1 || s.Relay != forwarder.DefaultName {
		t.Fatalf("before the first start: %+v, %v; want the group with no checkpoint, no reader, lag -1", s, err)
	}
	if all, err := mysqlbinlog.ReadStatus(ctx, o.db, o.database); err != nil || len(all) != 0 {
		t.Fatalf("ReadStatus before any relay ran: %+v, %v; want none", all, err)
	}

	stop := run(t, r)
	o.write(t, "a", 3)
	testenv.Eventually(t, 10*time.Second, "the rows to leave the outbox", func() bool { return o.count(t, "1") == 0 })
	s, err := r.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var progress, position, file string
	var pos uint64
	if err := o.db.QueryRow("SELECT progress, IF(progress = 'gtid', gtid_set, CONCAT(file, ':', pos)), file, pos FROM binlog_relays").
		Scan(&progress, &position, &file, &pos); err != nil {
		t.Fatal(err)
	}
	if !s.Active || s.Progress != progress || s.Position != position || s.File != file || s.Pos != pos || s.Purged || s.LogError != "" ||
		s.LagBytes < 0 || s.LagBytes > 1<<20 || s.CheckpointAge < 0 || s.CheckpointAge > time.Minute || s.Database != o.database {
		t.Fatalf("a relay reading: %+v; want it active, its checkpoint %s (%s:%d) read, a small lag", s, position, file, pos)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the group to show no reader once its relay stopped", func() bool { return !readStatus(t, o).Active })

	// The checkpoint stays; what the server writes since is the lag, in its file and the next.
	if _, err := o.db.Exec("CREATE TABLE filler (b LONGBLOB NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	fill := func() {
		t.Helper()
		if _, err := o.db.Exec("INSERT INTO filler VALUES (REPEAT('x', 100000))"); err != nil {
			t.Fatal(err)
		}
	}
	fill()
	before := readStatus(t, o)
	if before.LagBytes < 100000 {
		t.Fatalf("lag %d after a 100 kB row written since the checkpoint; want at least that", before.LagBytes)
	}
	if _, err := o.db.Exec("FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	fill()
	after := readStatus(t, o)
	if after.LagBytes < before.LagBytes+100000 || after.Purged {
		t.Fatalf("lag %d, then %d after a rotation and another 100 kB row; want the later file counted too", before.LagBytes, after.LagBytes)
	}

	con, _ := store.ConsoleOf(o.store)
	if _, err := con.SetPause(ctx, store.Pause{Scope: store.PauseRelay, Name: s.Relay, By: "test", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.db.Exec("UPDATE binlog_relays SET file = 'purged-bin.000001'"); err != nil {
		t.Fatal(err)
	}
	p := readStatus(t, o)
	if !p.Paused || !p.Purged || p.LagBytes != -1 {
		t.Fatalf("a paused group whose checkpoint's file the server no longer lists: %+v; want paused, purged, lag -1", p)
	}

	limited := testenv.OpenMySQL(t, newUser(t, o, ""))
	all, err := mysqlbinlog.ReadStatus(ctx, limited, o.database)
	if err != nil || len(all) != 1 {
		t.Fatalf("ReadStatus by a user without BINLOG MONITOR: %+v, %v; want the group and no error", all, err)
	}
	if l := all[0]; l.LagBytes != -1 || l.Purged || l.Position != p.Position || !l.Paused || !strings.Contains(l.LogError, "may not list the binary logs") ||
		!strings.Contains(l.LogError, "ON *.* TO") {
		t.Fatalf("by a user without BINLOG MONITOR: %+v; want the checkpoint, lag -1 and the GRANT that gives it", l)
	}
}
