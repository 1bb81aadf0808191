// Package sqlite is the SQLite dialect of outboxkit's store: its SQL files and numbered
// migrations, its claim (a lease written by UPDATE … RETURNING, as River's SQLite driver claims
// jobs: a transaction held across the publish would stop every writer of a single-writer database),
// its per-message lock (in-process, beside SQLite's single writer) and its wake-up (in-process,
// from the writers of the same store, under a short poll).
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

//go:embed sql/*.sql migrations/*.sql
var files embed.FS

// TimeLayout is how times are stored: UTC text of fixed width, which sorts as it compares.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// Dialect is SQLite.
type Dialect struct {
	sqlstore.TextParams
	name  string // the database's name, for errors
	q     sqlstore.Queries
	sql   map[string]string
	locks *keyedLocks
	wake  *broadcaster
}

// New returns the dialect of the database named name (a file path, for errors). Writers and
// relays wake one another through wakeKey: stores built with the same key share wake-ups.
func New(name, wakeKey string) *Dialect {
	d := &Dialect{TextParams: sqlstore.TextParams{Layout: TimeLayout}, name: name, sql: map[string]string{}, locks: locksFor(wakeKey), wake: broadcasterFor(wakeKey)}
	entries, err := files.ReadDir("sql")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		b, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		d.sql[strings.TrimSuffix(e.Name(), ".sql")] = render(string(b))
	}
	filter := d.sql["dead_letter_filter"]
	for k, v := range d.sql {
		d.sql[k] = strings.ReplaceAll(v, "{{dead_letter_filter}}", filter)
	}
	d.q = sqlstore.Queries{
		OutboxStats: d.sql["outbox_stats"], OutboxDeadLetters: d.sql["outbox_dead_letters"],
		LockOutboxDeadLetters: d.sql["lock_outbox_dead_letters"], ReplayOutbox: d.sql["replay_outbox"],
		PrunePublished: d.sql["prune_published"], MarkPublished: d.sql["mark_published"], DeletePublished: d.sql["delete_published"],
		MarkCommitted: d.sql["mark_committed"], DeleteCommitted: d.sql["delete_committed"],
		Seen: d.sql["seen"], InsertInbox: d.sql["insert_inbox"], CountDuplicate: d.sql["count_duplicate"],
		DeadLetter: d.sql["dead_letter"], CountDelivery: d.sql["count_delivery"],
		DeliveryCount: d.sql["delivery_count"], DeliveryFailed: d.sql["delivery_failed"],
		FirstDeliveryFailed: d.sql["first_delivery_failed"], ConsumerStats: d.sql["consumer_stats"],
		DeadLettersWaiting: d.sql["dead_letters_waiting"],
		InboxDeadLetters:   d.sql["inbox_dead_letters"], ResetDeliveries: d.sql["reset_deliveries"],
		MarkReplayed: d.sql["mark_replayed"], PruneInbox: d.sql["prune_inbox"], PruneDeliveries: d.sql["prune_deliveries"],
		LockVersion: d.sql["version_lock"], StoreVersion: d.sql["version_store"],
		VersionPlaceholder: d.sql["version_placeholder"], ParkMessage: d.sql["park_message"],
		TakeParked: d.sql["take_parked"], DeleteParked: d.sql["delete_parked"], ForgetInbox: d.sql["forget_inbox"],
		ClaimKey: d.sql["claim_key"], RecordResponse: d.sql["record_response"], LookupKey: d.sql["lookup_key"],
	}
	return d
}

// fleetNow is SQLite's clock, in TimeLayout: SQLite has no server, so it is the host's clock as
// the process running the statement reads it ('now' is the same at every use within a statement),
// to the millisecond. Members sharing a SQLite file share its host, and so its clock.
const fleetNow = "strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')"

// Fleet is the relay fleet's statements' view of SQLite.
func (d *Dialect) Fleet() sqlstore.FleetSQL {
	return sqlstore.FleetSQL{
		Now: fleetNow, Later: "strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', (%s / 1000000.0) || ' seconds')", Returning: true,
		RowValues:    "VALUES ",
		UpsertMember: d.sql["fleet_heartbeat"], AcquireLease: d.sql["fleet_acquire_lease"], RecordOutboxes: d.sql["fleet_record_outboxes"],
	}
}

func render(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", "main") }

func (d *Dialect) Info() store.Info { return store.Info{Name: "sqlite", Schema: d.name} }

func (d *Dialect) Queries() *sqlstore.Queries { return &d.q }

func (d *Dialect) Console() sqlstore.ConsoleSQL {
	return sqlstore.ConsoleSQL{
		Prefix: "main.", OutboxID: "uuid", Contains: "instr(%s, %s) > 0",
		InsertIgnore: "INSERT INTO", OnConflictNothing: " ON CONFLICT DO NOTHING",
		UpsertRelay: `INSERT INTO {{schema}}.relays (owner, name, host, pid, started_at, heartbeat_at, last_pass_at, last_publish_at,
    circuit_open_since, blocked, published_total, published_by_topic, pauses_seen_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, last_pass_at = excluded.last_pass_at,
    last_publish_at = excluded.last_publish_at, circuit_open_since = excluded.circuit_open_since, blocked = excluded.blocked,
    published_total = excluded.published_total, published_by_topic = excluded.published_by_topic,
    pauses_seen_at = excluded.pauses_seen_at`,
	}
}

func (d *Dialect) MarkFailed(ctx context.Context, q dbexec.Querier, rows []store.FailedRow, now time.Time, extra []any) error {
	type failed struct {
		Seq            int64   `json:"seq"`
		LastError      string  `json:"last_error"`
		NextAttemptAt  *string `json:"next_attempt_at"`
		DeadLetteredAt *string `json:"dead_lettered_at"`
	}
	out := make([]failed, len(rows))
	for i, r := range rows {
		out[i] = failed{Seq: r.Seq, LastError: r.Error}
		if r.DeadLettered {
			t := now.UTC().Format(TimeLayout)
			out[i].DeadLetteredAt = &t
		} else {
			t := r.NextAttemptAt.UTC().Format(TimeLayout)
			out[i].NextAttemptAt = &t
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, d.sql["mark_failed"], append([]any{string(b)}, extra...)...)
	return err
}

// maxMessagesPerInsert keeps one INSERT under SQLite's 32,766 parameters (six per row).
const maxMessagesPerInsert = 32766 / 6

func (d *Dialect) InsertOutbox(ctx context.Context, q dbexec.Querier, msgs []store.OutboxMessage) error {
	if len(msgs) > maxMessagesPerInsert {
		return fmt.Errorf("%d messages in one call; split them into calls of at most %d", len(msgs), maxMessagesPerInsert)
	}
	now := d.Time(time.Now())
	var b strings.Builder
	b.WriteString(d.sql["insert_outbox"])
	args := make([]any, 0, 6*len(msgs))
	for i, m := range msgs {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&b, "(?%d, ?%d, ?%d, ?%d, ?%d, ?%d)", n+1, n+2, n+3, n+4, n+5, n+6)
		var key any
		if m.PartitionKey != "" {
			key = m.PartitionKey
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		args = append(args, m.UUID, m.Topic, key, payload, string(m.Metadata), now)
	}
	if _, err := q.Exec(ctx, b.String(), args...); err != nil {
		return err
	}
	// Relays of this process wake now: their claim waits for SQLite's write lock, which the
	// writer's transaction holds until it commits, and then sees the rows (or none, after a
	// rollback).
	d.wake.signal()
	return nil
}

// Claim leases the window in one statement and gives back, per key, the rows after the key's
// first pending row outside the window (held by another relay's lease, waiting, or, when
// parking, dead-lettered); the lease lasts p.Hold.
func (d *Dialect) Claim(ctx context.Context, db dbexec.DB, p store.ClaimParams) (store.Claim, error) {
	if p.Owner == "" {
		return nil, errors.New("sqlite claims lease rows: ClaimParams.Owner is required")
	}
	hold := p.Hold
	if hold <= 0 {
		hold = 30 * time.Second
	}
	var kept []store.OutboxRow
	err := inTx(ctx, db, func(tx dbexec.Tx) error {
		rows, err := tx.Query(ctx, d.sql["claim_window"], p.Owner, d.Time(p.Now.Add(hold)), d.Time(p.Now), p.ParkKeyOnDeadLetter, p.Limit, p.Relay)
		if err != nil {
			return err
		}
		window, err := sqlstore.ScanOutboxRows(rows)
		if err != nil {
			return err
		}
		sort.Slice(window, func(i, j int) bool { return window[i].Seq < window[j].Seq })
		gaps, err := d.gaps(ctx, tx, window, p.ParkKeyOnDeadLetter)
		if err != nil {
			return err
		}
		var dropped []store.OutboxRow
		kept, dropped = sqlstore.KeepBeforeGaps(window, gaps)
		if len(dropped) > 0 {
			_, err = tx.Exec(ctx, d.sql["release_leases"], d.Int64s(seqsOf(dropped)), p.Owner)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &leaseClaim{d: d, db: db, owner: p.Owner, rows: kept}, nil
}

func (d *Dialect) gaps(ctx context.Context, q dbexec.Querier, window []store.OutboxRow, park bool) (map[string]int64, error) {
	return sqlstore.QueryGaps(ctx, q, d.sql["claim_gaps"], window, park)
}

func seqsOf(rows []store.OutboxRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

func inTx(ctx context.Context, db dbexec.DB, fn func(dbexec.Tx) error) error {
	tx, err := db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// leaseClaim is a claim of leased rows: Finish marks them in a transaction of its own, each
// statement fenced by the lease's owner (a row whose lease ran out and was taken by another relay
// is left to it), and gives the rest back.
type leaseClaim struct {
	d     *Dialect
	db    dbexec.DB
	owner string
	rows  []store.OutboxRow
	done  bool
}

func (c *leaseClaim) Rows() []store.OutboxRow { return c.rows }

func (c *leaseClaim) Finish(ctx context.Context, o store.Outcome) error {
	if c.done {
		return errors.New("claim already finished")
	}
	c.done = true
	if len(c.rows) == 0 {
		return nil
	}
	return c.d.Classify(inTx(ctx, c.db, func(tx dbexec.Tx) error {
		if err := sqlstore.Mark(ctx, tx, c.d, o, []any{c.owner}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, c.d.sql["release_leases"], c.d.Int64s(seqsOf(c.rows)), c.owner)
		return err
	}))
}

func (c *leaseClaim) Abandon(ctx context.Context) {
	if c.done {
		return
	}
	c.done = true
	if len(c.rows) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = c.db.Exec(actx, c.d.sql["release_leases"], c.d.Int64s(seqsOf(c.rows)), c.owner)
	}
}

// LockMessage serializes the deliveries of one message within the process (SQLite's single
// writer does the rest: across processes, concurrent deliveries of a message meet on the inbox
// row, and exactly one applies its effect), then counts the delivery.
func (d *Dialect) LockMessage(ctx context.Context, db dbexec.DB, consumer, messageID string, c store.Count) (dbexec.Conn, int, func(context.Context) bool, error) {
	key := consumer + "\x1f" + messageID
	if err := d.locks.lock(ctx, key); err != nil {
		return nil, 0, nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		d.locks.unlock(key)
		return nil, 0, nil, err
	}
	count, err := sqlstore.CountDelivery(ctx, conn, d, consumer, messageID, c)
	if err != nil {
		conn.Release(false)
		d.locks.unlock(key)
		return nil, 0, nil, err
	}
	return conn, count, func(context.Context) bool { d.locks.unlock(key); return true }, nil
}

// Waker wakes relays in this process when a writer commits (SQLite has no NOTIFY).
func (d *Dialect) Waker() store.Waker { return d.wake }

// SchemaVersion reads the version the database is migrated to and the newest this build knows.
func (d *Dialect) SchemaVersion(ctx context.Context, db dbexec.DB) (current, newest int, err error) {
	migrations := sqlstore.ParseMigrations(files, "migrations")
	err = db.QueryRow(ctx, "SELECT COALESCE(MAX(version), 0) FROM main.schema_migrations").Scan(&current)
	return current, migrations[len(migrations)-1].Version, err
}

func (d *Dialect) Migrate(ctx context.Context, db dbexec.DB) (store.MigrateResult, error) {
	var res store.MigrateResult
	err := inTx(ctx, db, func(tx dbexec.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS main.schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL
)`)
		return err
	})
	if err != nil {
		return res, d.migrateError("create the version table", err)
	}
	migrations := sqlstore.ParseMigrations(files, "migrations")
	newest := migrations[len(migrations)-1].Version
	for _, m := range migrations {
		applied := false
		err := inTx(ctx, db, func(tx dbexec.Tx) error {
			var present int
			if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM main.schema_migrations WHERE version = ?1", m.Version).Scan(&present); err != nil || present > 0 {
				return err
			}
			for _, stmt := range sqlstore.Statements(render(m.SQL)) {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO main.schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
				m.Version, m.Name, d.Time(time.Now()))
			applied = err == nil
			return err
		})
		if err != nil {
			return res, d.migrateError(fmt.Sprintf("apply %04d_%s", m.Version, m.Name), err)
		}
		if applied {
			res.Applied = append(res.Applied, m.Version)
		}
	}
	if err := db.QueryRow(ctx, "SELECT COALESCE(MAX(version), 0) FROM main.schema_migrations").Scan(&res.Version); err != nil {
		return res, d.migrateError("read the version", err)
	}
	if res.Version > newest {
		return res, fmt.Errorf("migrate %s: the database is at version %d but this build knows migrations up to %d: %w",
			d.name, res.Version, newest, store.ErrNewerSchema)
	}
	return res, nil
}

func (d *Dialect) migrateError(what string, err error) error {
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "readonly") || strings.Contains(msg, "read-only"):
		return fmt.Errorf("migrate %s: %s: the SQLite file is read-only (%v): give the process write access to the file "+
			"and its directory (SQLite writes a -wal and a -shm file beside it)", d.name, what, err)
	case strings.Contains(msg, "database is locked") || strings.Contains(msg, "sqlite_busy"):
		return fmt.Errorf("migrate %s: %s: the SQLite file stayed locked by another connection or process longer than "+
			"the busy timeout (%v): stop what holds it, or raise _pragma=busy_timeout", d.name, what, err)
	case strings.Contains(msg, "unable to open") || strings.Contains(msg, "cannot open"):
		return fmt.Errorf("migrate %s: %s: cannot open the SQLite file (%v): check the path and that its directory exists", d.name, what, err)
	}
	return fmt.Errorf("migrate %s: %s: %w", d.name, what, d.Classify(err))
}

// Classify translates SQLite errors once, at the seam.
func (d *Dialect) Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w (%v)", store.ErrTxDone, err)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "UNIQUE constraint failed: outbox.uuid"):
		return fmt.Errorf("%w (%v)", store.ErrDuplicateUUID, err)
	case strings.Contains(msg, "no such table"):
		return fmt.Errorf("%s: %w (%v)", d.name, store.ErrNotMigrated, err)
	case strings.Contains(msg, "database is locked"), strings.Contains(msg, "SQLITE_BUSY"), errors.Is(err, driver.ErrBadConn):
		return outboxkit.Unreachable(err) // contention or a lost handle: it passes, the message is not at fault
	}
	return err
}

// keyedLocks are mutexes by name, made on demand, that a waiter may give up on.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	ch   chan struct{} // holds a token while locked
	refs int
}

func (k *keyedLocks) lock(ctx context.Context, key string) error {
	k.mu.Lock()
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		k.release(key, l)
		return ctx.Err()
	}
}

func (k *keyedLocks) unlock(key string) {
	k.mu.Lock()
	l := k.locks[key]
	k.mu.Unlock()
	<-l.ch
	k.release(key, l)
}

func (k *keyedLocks) release(key string, l *keyedLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.locks, key)
	}
}

// broadcaster wakes every listening relay of a store when a writer inserted rows.
type broadcaster struct {
	mu        sync.Mutex
	listeners map[chan struct{}]struct{}
}

func (b *broadcaster) signal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.listeners {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// Listen implements store.Waker.
func (b *broadcaster) Listen(ctx context.Context, wake, listening func(), _ func(error)) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	b.listeners[ch] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.listeners, ch)
		b.mu.Unlock()
	}()
	listening()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			wake()
		}
	}
}

var registry = struct {
	sync.Mutex
	locks map[string]*keyedLocks
	wakes map[string]*broadcaster
}{locks: map[string]*keyedLocks{}, wakes: map[string]*broadcaster{}}

func locksFor(key string) *keyedLocks {
	registry.Lock()
	defer registry.Unlock()
	if registry.locks[key] == nil {
		registry.locks[key] = &keyedLocks{locks: map[string]*keyedLock{}}
	}
	return registry.locks[key]
}

func broadcasterFor(key string) *broadcaster {
	registry.Lock()
	defer registry.Unlock()
	if registry.wakes[key] == nil {
		registry.wakes[key] = &broadcaster{listeners: map[chan struct{}]struct{}{}}
	}
	return registry.wakes[key]
}
