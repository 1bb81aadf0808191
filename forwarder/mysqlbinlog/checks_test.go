package mysqlbinlog_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// setGlobal sets a global variable of the binlog server until the test ends. Tests that call it
// run alone (they do not call t.Parallel, so no parallel test of the package runs meanwhile).
func setGlobal(t *testing.T, name, value string) {
	t.Helper()
	admin := testenv.OpenMySQL(t, serverURL(t))
	var old string
	if err := admin.QueryRow("SELECT @@GLOBAL." + name).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("SET GLOBAL "+name+" = ?", value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("SET GLOBAL "+name+" = ?", old); err != nil {
			t.Errorf("restore %s = %s: %v", name, old, err)
		}
	})
}

// wantError fails the test unless err says each of wants.
func wantError(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Run returned nil, want an error saying %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// A server whose binary log does not carry the outbox's whole rows as row events is refused at
// start, with the setting to change.
func TestStartRefusesABinaryLogWithoutFullRowEvents(t *testing.T) {
	for _, c := range []struct{ name, value, want, fix string }{
		{"binlog_format", "STATEMENT", "binlog_format = STATEMENT", "SET GLOBAL binlog_format = 'ROW'"},
		{"binlog_format", "MIXED", "binlog_format = MIXED", "SET GLOBAL binlog_format = 'ROW'"},
		{"binlog_row_image", "MINIMAL", "binlog_row_image = MINIMAL", "SET GLOBAL binlog_row_image = 'FULL'"},
		{"binlog_row_image", "NOBLOB", "binlog_row_image = NOBLOB", "SET GLOBAL binlog_row_image = 'FULL'"},
	} {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			o := newOutbox(t)
			setGlobal(t, c.name, c.value)
			wantError(t, runErr(t, relayOn(t, o, newRecorder(), nil)), c.want, c.fix)
		})
	}
}

// The relay's ServerID may be neither the server's own server_id nor another replica's.
func TestStartRefusesAServerIDInUse(t *testing.T) {
	t.Parallel()
	t.Run("the server's own", func(t *testing.T) {
		t.Parallel()
		o := newOutbox(t)
		var own uint32
		if err := o.db.QueryRow("SELECT @@GLOBAL.server_id").Scan(&own); err != nil {
			t.Fatal(err)
		}
		r := relayOn(t, o, newRecorder(), func(_ *forwarder.Config, c *mysqlbinlog.Config) { c.ServerID = own })
		wantError(t, runErr(t, r), fmt.Sprintf("ServerID %d is the server's own server_id", own), "Config.ServerID")
	})
	t.Run("another replica's", func(t *testing.T) {
		t.Parallel()
		id := uint32(1000 + time.Now().UnixNano()%1_000_000_000)
		withID := func(_ *forwarder.Config, c *mysqlbinlog.Config) { c.ServerID = id }
		first := newOutbox(t)
		run(t, relayOn(t, first, newRecorder(), withID))
		second := newOutbox(t)
		wantError(t, runErr(t, relayOn(t, second, newRecorder(), withID)),
			fmt.Sprintf("server_id %d is taken by another replica of the server", id), first.database, "Config.ServerID")
	})
}

// A user without the privileges to read the binary log is refused, with the GRANT that fixes
// it; with them (and those on the outbox's database) the relay works.
func TestStartRefusesAUserWithoutTheReplicationPrivileges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		global string // granted ON *.*, "" for none
		wants  []string
	}{
		{"no privilege", "", []string{"may not read the binary log's status", "GRANT BINLOG MONITOR, REPLICATION SLAVE ON *.* TO"}},
		{"BINLOG MONITOR alone", "BINLOG MONITOR", []string{"may not read the binary log", "REPLICATION SLAVE", "GRANT BINLOG MONITOR, REPLICATION SLAVE ON *.* TO"}},
		{"both", "BINLOG MONITOR, REPLICATION SLAVE", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := newOutbox(t)
			if !isMariaDB(t, o) {
				t.Skip("the privileges named are MariaDB's")
			}
			userURL := newUser(t, o, c.global)
			pub := newRecorder()
			r := relayOn(t, o, pub, func(_ *forwarder.Config, cfg *mysqlbinlog.Config) { cfg.URL = userURL })
			if c.wants != nil {
				wantError(t, runErr(t, r), c.wants...)
				return
			}
			stop := run(t, r)
			ids := o.write(t, "a", 2)
			testenv.Eventually(t, 10*time.Second, "the rows to arrive through the relay of a user with the documented privileges", func() bool { return pub.has(ids) })
			testenv.Eventually(t, 10*time.Second, "the rows to leave the outbox", func() bool { return o.count(t, "1") == 0 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func isMariaDB(t *testing.T, o *outbox) bool {
	var v string
	if err := o.db.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(strings.ToLower(v), "mariadb")
}

// newUser creates a user with the privileges the relay needs on o's database and global ones
// (ON *.*), dropped when the test ends, and returns the URL that connects as it.
func newUser(t *testing.T, o *outbox, global string) string {
	t.Helper()
	name := testenv.UniqueName(t, "u")
	if len(name) > 80 {
		name = name[:80]
	}
	account := "'" + name + "'@'127.0.0.1'"
	exec := func(q string) {
		t.Helper()
		if _, err := o.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE USER " + account + " IDENTIFIED BY 'pw'")
	t.Cleanup(func() { _, _ = o.db.Exec("DROP USER IF EXISTS " + account) })
	exec("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `" + o.database + "`.* TO " + account)
	if global != "" {
		exec("GRANT " + global + " ON *.* TO " + account)
	}
	u, err := url.Parse(o.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(name, "pw")
	return u.String()
}

// An outbox that is not migrated is refused, as the polling relay refuses it.
func TestStartRefusesAnOutboxNotMigrated(t *testing.T) {
	t.Parallel()
	o := newDatabase(t)
	err := runErr(t, relayOn(t, o, newRecorder(), nil))
	if !errors.Is(err, store.ErrNotMigrated) {
		t.Fatalf("Run: %v, want store.ErrNotMigrated", err)
	}
}

// A writer whose session logs row images without the outbox's columns stops the relay, with the
// setting to change: the relay cannot publish those rows from the log.
func TestARowEventWithoutTheOutboxsColumnsStopsTheRelay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ set, want string }{
		{"SET SESSION binlog_row_image = 'MINIMAL'", "lacks its column"},
		{"SET SESSION binlog_format = 'STATEMENT'", "written to the binary log as a statement"},
	} {
		t.Run(c.set, func(t *testing.T) {
			t.Parallel()
			o := newOutbox(t)
			r := relayOn(t, o, newRecorder(), nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			select {
			case <-r.Reading():
			case err := <-done:
				t.Fatalf("relay ended before reading the log: %v", err)
			}
			conn, err := o.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, c.set); err != nil {
				t.Fatal(err)
			}
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			o.insert(t, tx, "a", 0, 1)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			err = <-done
			if ctx.Err() != nil {
				t.Fatalf("relay ran until its deadline instead of stopping (returned %v)", err)
			}
			wantError(t, err, c.want, "let the writers reconnect")
		})
	}
}

// New refuses what the relay does not support, naming the field.
func TestNewRefusesAConfigItCannotRun(t *testing.T) {
	t.Parallel()
	db := testenv.OpenMySQL(t, "mysql://nobody@127.0.0.1:1/nothing") // never connected
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := forwarder.New(forwarder.Config{Store: st, Publisher: newRecorder(), ParkKeyOnDeadLetter: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = mysqlbinlog.New(mysqlbinlog.Config{Forwarder: f})
	for _, w := range []string{"field URL is required", "ParkKeyOnDeadLetter is not supported"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("New: %v, want it to say %q", err, w)
		}
	}
	if _, err := mysqlbinlog.New(mysqlbinlog.Config{}); err == nil || !strings.Contains(err.Error(), "field Forwarder is required") {
		t.Errorf("New without a forwarder: %v", err)
	}
}
