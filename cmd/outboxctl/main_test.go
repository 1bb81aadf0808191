package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

func ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsageErrorsExitTwoAndSayWhatToDo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"status"}, "pass --db"},
		{[]string{"--db", "::nonsense", "status"}, "is not a database URL"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "outbox", "dead", "replay", "--since", "yesterday"}, "RFC 3339"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "outbox", "dead", "list", "--seq", "abc"}, "positive integers"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "outbox", "dead", "show"}, "takes one SEQ"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "inbox", "alive"}, "dead list|show|replay"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "prune", "--inbox-older-than", "-1h"}, "must be positive"},
		// A forgotten filter never replays everything: a usage error naming the flags, --all first among them.
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "outbox", "dead", "replay"}, "or pass --all"},
		{[]string{"--db", "postgres://x@127.0.0.1:1/x", "inbox", "dead", "replay", "--broker", "memory://"}, "--consumer"},
		// Global flags after the command are read too: here the error is about the command's own flag.
		{[]string{"prune", "--db", "postgres://x@127.0.0.1:1/x", "--inbox-older-than", "-1h"}, "must be positive"},
	} {
		code, _, stderr := ctl(t, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
	if code, stdout, _ := ctl(t, "--help"); code != 0 || !strings.Contains(stdout, "Commands:") {
		t.Errorf("--help: exit %d", code)
	}
}

// --db and --schema work after the command as well as before it.
func TestGlobalFlagsAfterTheCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	if code, _, stderr := ctl(t, "migrate", "--db", "sqlite://"+path); code != 0 {
		t.Fatalf("migrate --db after the command: exit %d: %s", code, stderr)
	}
	if code, stdout, stderr := ctl(t, "status", "--db", "sqlite://"+path); code != 0 || !strings.Contains(stdout, "outbox") {
		t.Fatalf("status --db after the command: exit %d: %s%s", code, stdout, stderr)
	}
}

// Reading a SQLite file that is not there is an error, not a new empty database.
func TestReadingAMissingSQLiteFileCreatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "typo.db")
	for _, cmd := range [][]string{{"status"}, {"outbox", "dead", "list"}, {"inbox", "dead", "list"}, {"prune"}} {
		code, _, stderr := ctl(t, append([]string{"--db", "sqlite://" + path}, cmd...)...)
		if code != 1 || !strings.Contains(stderr, "the file must exist") {
			t.Errorf("%v on a missing file: exit %d, stderr %q; want exit 1 saying the file must exist", cmd, code, stderr)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%v created %s", cmd, path)
		}
	}
}

func TestBadDatabaseExitsOneAndSaysWhy(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"postgres://nobody@127.0.0.1:1/none?connect_timeout=2", "cannot reach the database"},
		{"mysql://nobody@127.0.0.1:1/none?timeout=2s", "cannot reach the database"},
		{"oracle://x@y/z", `scheme "oracle" is not supported`},
		{"postgres://x@127.0.0.1:1/x?connect_timeout=2", "cannot reach the database"},
	} {
		code, _, stderr := ctl(t, "--db", c.url, "status")
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and %q", c.url, code, stderr, c.want)
		}
	}
	code, _, stderr := ctl(t, "--db", "postgres://x@127.0.0.1:1/x", "--schema", "Bad-Name", "status")
	if code != 1 || !strings.Contains(stderr, "lowercase letters") {
		t.Errorf("bad schema: exit %d, stderr %q", code, stderr)
	}
}

// The same operator session on every store: outboxctl takes the database from its URL.
func TestMigrateStatusAndOutboxDeadLetters(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewEmptyPG(t)
		operate(t, pg.URL, string(pg.Schema))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		m := testenv.NewMySQL(t)
		operate(t, m.URL, m.Database)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		operate(t, "sqlite://"+filepath.Join(t.TempDir(), "ops.db"), "")
	})
}

func operate(t *testing.T, url, schema string) {
	db := []string{"--db", url}
	if schema != "" {
		db = append(db, "--schema", schema)
	}

	if code, _, stderr := ctl(t, append(db, "status")...); code != 1 || !strings.Contains(stderr, "outboxctl migrate") {
		t.Fatalf("status before migrate: exit %d, %q; want a hint to migrate", code, stderr)
	}
	if code, stdout, stderr := ctl(t, append(db, "migrate")...); code != 0 || !strings.Contains(stdout, "migrated to version") {
		t.Fatalf("migrate: exit %d, %q %q", code, stdout, stderr)
	}
	if code, stdout, _ := ctl(t, append(db, "migrate")...); code != 0 || !strings.Contains(stdout, "up to date") {
		t.Fatalf("second migrate: exit %d, %q", code, stdout)
	}

	// Two events; the broker refuses the one for key "bad" until it is dead-lettered.
	ctx := context.Background()
	s, err := store.Open(ctx, url, store.OpenOptions{Schema: schema, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	bad, good := pipeline.NewEvent("E", "bad", []byte(`{"n":1}`)), pipeline.NewEvent("E", "good", nil)
	if err := pub.Publish("orders", bad, good); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	refusing := &refuser{refuse: "bad"}
	relay, err := forwarder.New(forwarder.Config{Store: s, Publisher: refusing, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.DispatchBatch(ctx); err != nil {
		t.Fatal(err)
	}

	code, stdout, _ := ctl(t, append(db, "status", "--json")...)
	var st Status
	if code != 0 || json.Unmarshal([]byte(stdout), &st) != nil || st.Outbox.DeadLettered != 1 || st.Outbox.Pending != 0 {
		t.Fatalf("status --json: exit %d, %s", code, stdout)
	}
	code, stdout, _ = ctl(t, append(db, "outbox", "dead", "list", "--error", "refused")...)
	if code != 0 || !strings.Contains(stdout, bad.UUID) || strings.Contains(stdout, good.UUID) {
		t.Fatalf("dead list: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = ctl(t, append(db, "outbox", "dead", "show", "1")...)
	if code != 0 || !strings.Contains(stdout, `"payload_text": "{\"n\":1}"`) || !strings.Contains(stdout, `"message_id": "`+bad.UUID+`"`) {
		t.Fatalf("dead show: exit %d\n%s", code, stdout)
	}
	if code, _, stderr := ctl(t, append(db, "outbox", "dead", "show", "2")...); code != 1 || !strings.Contains(stderr, "no dead letter") {
		t.Fatalf("show of a published row: exit %d, %q", code, stderr)
	}
	if code, _, stderr := ctl(t, append(db, "outbox", "dead", "replay")...); code != 2 || !strings.Contains(stderr, "or pass --all") {
		t.Fatalf("replay without a filter: exit %d, %q", code, stderr)
	}
	code, stdout, _ = ctl(t, append(db, "outbox", "dead", "replay", "--key", "bad", "--dry-run")...)
	if code != 0 || !strings.Contains(stdout, "1 rows would be replayed") {
		t.Fatalf("dry run: exit %d\n%s", code, stdout)
	}
	if s, _ := relay.Stats(ctx); s.DeadLettered != 1 {
		t.Fatal("the dry run changed something")
	}
	refusing.refuse = ""
	code, stdout, _ = ctl(t, append(db, "outbox", "dead", "replay", "--key", "bad")...)
	if code != 0 || !strings.Contains(stdout, "replayed 1 outbox rows") {
		t.Fatalf("replay: exit %d\n%s", code, stdout)
	}
	if res, err := relay.DispatchBatch(ctx); err != nil || res.Published != 1 {
		t.Fatalf("after replay the relay published %+v, %v", res, err)
	}

	code, stdout, _ = ctl(t, append(db, "prune", "--published-older-than", "1ns")...)
	if code != 0 || !strings.Contains(stdout, "deleted 2 published outbox rows") {
		t.Fatalf("prune: exit %d\n%s", code, stdout)
	}

}

type refuser struct{ refuse string }

func (r *refuser) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if r.refuse != "" && outboxkit.PartitionKey(m) == r.refuse {
			return errors.New("refused by the broker")
		}
	}
	return nil
}

func (r *refuser) Close() error { return nil }
