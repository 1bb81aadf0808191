package sqlstore

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// ConsoleSQL is what the console's statements need of a dialect. The statements are written once,
// here, with ?N parameters and a few {{names}} the dialect fills in: the console's selections
// combine filters freely, and a statement per combination and database would be hundreds of files
// saying the same thing.
type ConsoleSQL struct {
	// Prefix goes before a table's name: a quoted schema or database and a dot.
	Prefix string
	// Dollar: parameters are $N, and "x IN (?N)" over a list becomes "x = ANY($N)" (Postgres).
	Dollar bool
	// OutboxID is the outbox's message id as text.
	OutboxID string
	// DeadWaiting is the predicate of a consumer's waiting letter, when the dialect has a column
	// for it (MySQL, whose indexes lead with it); default "replayed_at IS NULL AND archived_at IS NULL".
	DeadWaiting string
	// Contains is a format of (column, parameter): true when the column contains the text.
	Contains string
	// ForUpdate locks the rows a SELECT reads, where the database has row locks.
	ForUpdate string
	// InsertIgnore and OnConflictNothing make an INSERT that skips a duplicate key.
	InsertIgnore, OnConflictNothing string
	// UpsertRelay records a relay's heartbeat: ?1 owner … ?13 pauses seen at.
	UpsertRelay string
	// OutboxScanHint follows the outbox's name where a console query selects its dead letters
	// (MySQL: FORCE INDEX on the dead-letter index, without which a filter on a column no index
	// has — failure_group — read the whole outbox: 1.3 s at a million rows).
	OutboxScanHint string
	// ReadSetup, when set, runs first in a transaction around each console read: Postgres plans
	// a prepared statement generically after five runs, and a generic plan of "dead-lettered
	// after $1" reads a third of the table (measured: 20 ms becoming 500–900 ms at a million
	// letters), so the console's reads ask for a plan of their own values.
	ReadSetup string
}

var (
	inList     = regexp.MustCompile(`([A-Za-z_.]+) IN \(\?(\d+)\)`)
	numbered   = regexp.MustCompile(`\?(\d+)`)
	renderMu   sync.Mutex
	renderMemo = map[string]string{}
)

// render turns a console statement into the dialect's.
func (c ConsoleSQL) render(q string) string {
	key := c.Prefix + "\x00" + q
	renderMu.Lock()
	defer renderMu.Unlock()
	if r, ok := renderMemo[key]; ok {
		return r
	}
	waiting := c.DeadWaiting
	if waiting == "" {
		waiting = "replayed_at IS NULL AND archived_at IS NULL"
	}
	r := strings.NewReplacer("{{schema}}.", c.Prefix, "{{outbox_id}}", c.OutboxID, "{{dead_waiting}}", waiting,
		"{{for_update}}", c.ForUpdate, "{{insert_ignore}}", c.InsertIgnore, "{{on_conflict_nothing}}", c.OnConflictNothing).Replace(q)
	if c.Dollar {
		r = inList.ReplaceAllString(r, "$1 = ANY(?$2)")
		r = numbered.ReplaceAllString(r, "$$$1")
	}
	if len(renderMemo) < 4096 { // built statements vary with filters; the common ones stay cached
		renderMemo[key] = r
	}
	return r
}

// contains is the dialect's "column contains parameter n".
func (c ConsoleSQL) contains(column string, n int) string {
	return fmt.Sprintf(c.Contains, column, fmt.Sprintf("?%d", n))
}

// The two sides' tables, as a listing reads them.
type letterTable struct {
	outbox  bool
	table   string
	scan    string // the table as a selection scans it (with the dialect's hint)
	id      string // the key: seq or id
	waiting string // the predicate of a waiting letter
	reason  string // the last error's column
}

func (c ConsoleSQL) tables() (outbox, consumers letterTable) {
	waiting := c.DeadWaiting
	if waiting == "" {
		waiting = "replayed_at IS NULL AND archived_at IS NULL"
	}
	return letterTable{outbox: true, table: "{{schema}}.outbox", scan: "{{schema}}.outbox" + c.OutboxScanHint, id: "seq",
			waiting: "dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL", reason: "last_error"},
		letterTable{table: "{{schema}}.dead_letters", scan: "{{schema}}.dead_letters", id: "id", waiting: waiting, reason: "reason"}
}

// listColumns are a listing's columns, the same for both sides: id, consumer, topic, message id,
// key, event type, error (its first 300 characters), attempts, dead-lettered at, replayed at,
// archived at, failure group, payload size, created at.
func (t letterTable) listColumns(alias string) string {
	a := alias + "."
	if t.outbox {
		return a + "seq, '', " + a + "topic, {{outbox_id}}, coalesce(" + a + "partition_key, ''), coalesce(" +
			a + "event_type, ''), substr(coalesce(" + a + "last_error, ''), 1, 300), " + a + "attempts, " + a + "dead_lettered_at, NULL, " +
			a + "archived_at, coalesce(" + a + "failure_group, 0), length(" + a + "payload), " + a + "created_at"
	}
	return a + "id, " + a + "consumer, " + a + "topic, " + a + "message_id, coalesce(" + a + "partition_key, ''), coalesce(" +
		a + "event_type, ''), substr(" + a + "reason, 1, 300), " + a + "deliveries, " + a + "dead_lettered_at, " + a + "replayed_at, " +
		a + "archived_at, coalesce(" + a + "failure_group, 0), length(" + a + "payload), NULL"
}

// letterScan reads a row of listColumns into l (dest, then done once scanned): kept beside
// listColumns, so that the columns and their destinations change together.
type letterScan struct {
	l                                 *store.DeadLetter
	dead, replayed, archived, created dbexec.Time
}

func (r *letterScan) dest() []any {
	l := r.l
	return []any{&l.ID, &l.Consumer, &l.Topic, &l.MessageID, &l.PartitionKey, &l.EventType, &l.Reason, &l.Attempts,
		&r.dead, &r.replayed, &r.archived, &l.FailureGroup, &l.PayloadSize, &r.created}
}

func (r *letterScan) done() {
	r.l.DeadLetteredAt, r.l.ReplayedAt, r.l.ArchivedAt, r.l.CreatedAt = r.dead.Time, r.replayed.Time, r.archived.Time, r.created.Time
}

// reading runs a console read, in a transaction set up by the dialect's ReadSetup when it has one.
func (s *Store) reading(ctx context.Context, fn func(q dbexec.Querier) error) error {
	setup := s.d.Console().ReadSetup
	if setup == "" {
		return fn(s.db)
	}
	tx, err := s.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return s.d.Classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, setup); err != nil {
		return s.d.Classify(err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return s.d.Classify(tx.Commit(ctx))
}
