// Package pg is the Postgres dialect of outboxkit's store, shared by the pgx driver (store/pgxstore)
// and the database/sql one (store/pgsqlstore): its SQL files, its numbered migrations, its claim
// (one statement, FOR UPDATE SKIP LOCKED, rows held by the pass's transaction), its per-message
// lock (a session advisory lock) and its wake-up (NOTIFY in the writer's INSERT, LISTEN in the relay).
package pg

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/pgerr"
	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/internal/walmsg"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// Config configures the dialect.
type Config struct {
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Driver names the library in Info ("pgx", "database/sql").
	Driver string
	// NativeArrays passes Go slices as array parameters (pgx); otherwise they go as array
	// literals, which every database/sql driver for Postgres accepts.
	NativeArrays bool
	// DisableNotify leaves pg_notify out of the writers' INSERT.
	DisableNotify bool
	// ListenConnect opens the relay's LISTEN connection; nil: no wake-ups, relays poll.
	ListenConnect func(ctx context.Context) (*pgx.Conn, error)
	// ListenRetry is the wait before the LISTEN connection is opened again. Default 2s.
	ListenRetry time.Duration
	// Listener, when set, wakes the relays instead of a LISTEN connection of their own
	// (ListenConnect is then unused): one connection shared with other schemas' stores.
	Listener store.SharedListener
	// WAL writes events as logical decoding messages instead of outbox rows (see pgxstore.Config).
	WAL bool
}

// Dialect is Postgres.
type Dialect struct {
	cfg                         Config
	walReady                    atomic.Bool // a log relay in WAL mode has its slot
	schema                      Name
	q                           sqlstore.Queries
	claim, markFailed           string
	fleet                       sqlstore.FleetSQL
	lockCount, lockRead, unlock string
	// insertOne is the text of the writers' INSERT of one message, what nearly every Publish
	// sends: built once instead of per call.
	insertOne string
}

// New returns the dialect; the schema name is validated.
func New(cfg Config) (*Dialect, error) {
	name, err := Parse(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.ListenRetry == 0 {
		cfg.ListenRetry = 2 * time.Second
	}
	d := &Dialect{cfg: cfg, schema: name}
	filter := d.read("dead_letter_filter.sql")
	read := func(file string) string {
		return strings.ReplaceAll(d.read(file), "{{dead_letter_filter}}", filter)
	}
	d.q = sqlstore.Queries{
		OutboxStats:           read("outbox_stats.sql"),
		OutboxDeadLetters:     read("outbox_dead_letters.sql"),
		LockOutboxDeadLetters: read("lock_outbox_dead_letters.sql"),
		ReplayOutbox:          read("replay_outbox.sql"),
		PrunePublished:        read("prune_published.sql"),
		MarkPublished:         read("mark_published.sql"),
		DeletePublished:       read("delete_published.sql"),
		MarkCommitted:         read("mark_committed.sql"),
		DeleteCommitted:       read("delete_committed.sql"),
		Seen:                  read("seen.sql"),
		InsertInbox:           read("insert_inbox.sql"),
		InsertInboxes:         read("insert_inboxes.sql"),
		CountDuplicate:        read("count_duplicate.sql"),
		DeadLetter:            read("dead_letter.sql"),
		DeliveryCount:         read("delivery_count.sql"),
		DeliveryFailed:        read("delivery_failed.sql"),
		FirstDeliveryFailed:   read("first_delivery_failed.sql"),
		ConsumerStats:         read("consumer_stats.sql"),
		DeadLettersWaiting:    read("dead_letters_waiting.sql"),
		InboxDeadLetters:      read("inbox_dead_letters.sql"),
		ResetDeliveries:       read("reset_deliveries.sql"),
		MarkReplayed:          read("mark_replayed.sql"),
		PruneInbox:            read("prune_inbox.sql"),
		PruneDeliveries:       read("prune_deliveries.sql"),
		LockVersion:           read("version_lock.sql"),
		StoreVersion:          read("version_store.sql"),
		VersionPlaceholder:    read("version_placeholder.sql"),
		ParkMessage:           read("park_message.sql"),
		TakeParked:            read("take_parked.sql"),
		ForgetInbox:           read("forget_inbox.sql"),
		ClaimKey:              read("claim_key.sql"),
		RecordResponse:        read("record_response.sql"),
		LookupKey:             read("lookup_key.sql"),
	}
	d.claim, d.markFailed = read("claim.sql"), read("mark_failed.sql")
	d.lockCount, d.lockRead, d.unlock = read("lock_count_delivery.sql"), read("lock_delivery_count.sql"), read("unlock_message.sql")
	d.insertOne = insertText(name, 1, !cfg.DisableNotify)
	d.fleet = sqlstore.FleetSQL{
		Now: "now()", Later: "now() + %s::bigint * interval '1 microsecond'", Returning: true,
		UpsertMember: read("fleet_heartbeat.sql"), AcquireLease: read("fleet_acquire_lease.sql"),
		RecordOutboxes: read("fleet_record_outboxes.sql"),
	}
	return d, nil
}

func (d *Dialect) read(file string) string {
	b, err := sqlFiles.ReadFile("sql/" + file)
	if err != nil {
		panic("pg: embedded query " + file + " missing: " + err.Error())
	}
	return d.schema.Render(string(b))
}

// Schema is the dialect's schema.
func (d *Dialect) Schema() Name { return d.schema }

func (d *Dialect) Info() store.Info {
	return store.Info{Name: "postgres (" + d.cfg.Driver + ")", Schema: string(d.schema)}
}

func (d *Dialect) Queries() *sqlstore.Queries { return &d.q }

func (d *Dialect) Console() sqlstore.ConsoleSQL {
	return sqlstore.ConsoleSQL{
		Prefix: d.schema.Ident() + ".", Dollar: true, OutboxID: "coalesce(uuid_text, uuid::text)",
		Contains: "strpos(%s, %s) > 0", ForUpdate: " FOR UPDATE", ReadSetup: "SET LOCAL plan_cache_mode = force_custom_plan",
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

// Fleet is the relay fleet's statements' view of Postgres. Its clock is the server's: now(), the
// start of the statement's transaction, which every fleet statement runs alone in (but
// LeaveFleet's two, which share it).
func (d *Dialect) Fleet() sqlstore.FleetSQL { return d.fleet }

func (d *Dialect) Int64s(v []int64) any {
	if v == nil {
		v = []int64{}
	}
	if d.cfg.NativeArrays {
		return v
	}
	return int64Array(v)
}

func (d *Dialect) Strings(v []string) any {
	if v == nil {
		v = []string{}
	}
	if d.cfg.NativeArrays {
		return v
	}
	return textArray(v)
}

func (d *Dialect) Time(t time.Time) any { return t }

func (d *Dialect) NullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

type failedJSON struct {
	Seq            int64      `json:"seq"`
	LastError      string     `json:"last_error"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	DeadLetteredAt *time.Time `json:"dead_lettered_at"`
}

// FailedJSON is the JSON array MarkFailed statements read: {seq, last_error, next_attempt_at,
// dead_lettered_at}, with RFC 3339 times or null.
func FailedJSON(rows []store.FailedRow, now time.Time) (string, error) {
	out := make([]failedJSON, len(rows))
	for i, r := range rows {
		out[i] = failedJSON{Seq: r.Seq, LastError: r.Error}
		if r.DeadLettered {
			out[i].DeadLetteredAt = &now
		} else {
			next := r.NextAttemptAt
			out[i].NextAttemptAt = &next
		}
	}
	b, err := json.Marshal(out)
	return string(b), err
}

func (d *Dialect) MarkFailed(ctx context.Context, q dbexec.Querier, rows []store.FailedRow, now time.Time, extra []any) error {
	rowsJSON, err := FailedJSON(rows, now)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, d.markFailed, append([]any{rowsJSON}, extra...)...)
	return err
}

// MaxMessagesPerInsert keeps one INSERT under Postgres's 65,535 bind parameters (six per row).
const MaxMessagesPerInsert = 65535 / 6

// InsertQuery builds the INSERT of msgs, with the pg_notify that wakes relays at commit unless
// notify is false. It is one statement however many messages.
func InsertQuery(schema Name, msgs []store.OutboxMessage, notify bool) (string, []any, error) {
	if len(msgs) > MaxMessagesPerInsert {
		return "", nil, fmt.Errorf("%d messages in one call; split them into calls of at most %d", len(msgs), MaxMessagesPerInsert)
	}
	return insertText(schema, len(msgs), notify), insertArgs(schema, msgs, notify), nil
}

// insertText is the text of InsertQuery for n messages: it depends on nothing else, so drivers
// keep it prepared.
func insertText(schema Name, n int, notify bool) string {
	q := make([]byte, 0, 256+n*80) // a row's placeholders are about 70 bytes
	if notify {
		q = append(q, "WITH inserted AS (\n"...)
	}
	q = append(q, "INSERT INTO "...)
	q = append(q, schema.Ident()...)
	q = append(q, ".outbox (uuid, uuid_text, topic, partition_key, payload, metadata) VALUES "...)
	for i := range n {
		if i > 0 {
			q = append(q, ", "...)
		}
		for c, cast := range columnTypes {
			if c == 0 {
				q = append(q, "($"...)
			} else {
				q = append(q, ", $"...)
			}
			q = strconv.AppendInt(q, int64(6*i+c+1), 10)
			q = append(q, cast...)
		}
		q = append(q, ')')
	}
	if notify {
		// Only when no relay says it is awake (relay_awake): an awake relay polls, and a NOTIFY
		// serialises the writers' commits.
		q = append(q, "\n)\nSELECT pg_notify($"...)
		q = strconv.AppendInt(q, int64(6*n+1), 10)
		q = append(q, ", '') WHERE NOT EXISTS (SELECT 1 FROM "...)
		q = append(q, schema.Ident()...)
		q = append(q, ".relay_awake WHERE awake_until > clock_timestamp())"...)
	}
	return string(q)
}

// columnTypes are the casts of an outbox row's six parameters, in InsertQuery's column order.
var columnTypes = [6]string{"::uuid", "::text", "::text", "::text", "::bytea", "::text"}

// insertArgs are InsertQuery's arguments for msgs: six a message, then the notify channel.
func insertArgs(schema Name, msgs []store.OutboxMessage, notify bool) []any {
	args := make([]any, 0, len(msgs)*6+1)
	for _, m := range msgs {
		var key any
		if m.PartitionKey != "" {
			key = m.PartitionKey
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // the column is NOT NULL; an empty payload is still a payload
		}
		id, text := pgsql.StoredID(m.UUID)
		args = append(args, id, text, m.Topic, key, payload, string(m.Metadata))
	}
	if notify {
		args = append(args, schema.NotifyChannel())
	}
	return args
}

// OutboxInsert is the writers' INSERT of msgs in d's schema, with the wake-up unless
// DisableNotify: what InsertOutbox runs, and what pgxstore.Transact sends with the COMMIT.
func (d *Dialect) OutboxInsert(msgs []store.OutboxMessage) (string, []any, error) {
	if d.cfg.WAL {
		return EmitQuery(d.schema, msgs)
	}
	if len(msgs) == 1 {
		return d.insertOne, insertArgs(d.schema, msgs, !d.cfg.DisableNotify), nil
	}
	return InsertQuery(d.schema, msgs, !d.cfg.DisableNotify)
}

// EmitQuery builds the statement that writes msgs to the write-ahead log as transactional logical
// decoding messages, in order, one statement however many: nothing is written to a table.
func EmitQuery(schema Name, msgs []store.OutboxMessage) (string, []any, error) {
	if len(msgs) > MaxMessagesPerInsert {
		return "", nil, fmt.Errorf("%d messages in one call; split them into calls of at most %d", len(msgs), MaxMessagesPerInsert)
	}
	var q strings.Builder
	args := make([]any, 0, len(msgs)+1)
	args = append(args, walmsg.Prefix(string(schema)))
	q.WriteString("SELECT ")
	for i, m := range msgs {
		if i > 0 {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "pg_logical_emit_message(true, $1, $%d::bytea)", len(args)+1)
		args = append(args, walmsg.Encode(walmsg.Envelope{UUID: m.UUID, Topic: m.Topic, PartitionKey: m.PartitionKey,
			Metadata: m.Metadata, Payload: m.Payload}))
	}
	return q.String(), args, nil
}

// ErrNoWALRelay is returned to writers in WAL mode before a log relay in WAL mode has made its
// replication slot: a message written then would be read by nobody.
var ErrNoWALRelay = errors.New("no log relay in WAL mode has made its replication slot in this schema yet, so events written " +
	"to the log now would be read by nobody: start the relay (forwarder/pglog, Mode pglog.ModeWAL) once before the writers")

// CheckWALRelay refuses to write to the log before a log relay in WAL mode has made its slot. Once
// one has, it costs nothing more: a slot, once made, is kept (and its loss stops the relay loudly).
func (d *Dialect) CheckWALRelay(ctx context.Context, q dbexec.Querier) error {
	if !d.cfg.WAL || d.walReady.Load() {
		return nil
	}
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+d.schema.Ident()+`.log_relays c
		JOIN pg_replication_slots s ON s.slot_name = c.slot_name AND s.database = current_database()
		WHERE c.mode = 'wal')`).Scan(&ok)
	if err != nil {
		return fmt.Errorf("check for a log relay in WAL mode: %w", err)
	}
	if !ok {
		return ErrNoWALRelay
	}
	d.walReady.Store(true)
	return nil
}

func (d *Dialect) InsertOutbox(ctx context.Context, q dbexec.Querier, msgs []store.OutboxMessage) error {
	if err := d.CheckWALRelay(ctx, q); err != nil {
		return err
	}
	query, args, err := d.OutboxInsert(msgs)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, query, args...)
	return err
}

// Awake tells writers that a relay is awake for d: they skip pg_notify until then.
func (d *Dialect) Awake(ctx context.Context, q dbexec.Querier, dur time.Duration) error {
	_, err := q.Exec(ctx, "UPDATE "+d.schema.Ident()+".relay_awake SET awake_until = clock_timestamp() + $1 * interval '1 microsecond'",
		dur.Microseconds())
	return err
}

// Claim runs claim.sql in a transaction that holds the rows until the pass finishes. If the
// relay stalls with the rows locked longer than Hold, Postgres ends its session and frees them.
func (d *Dialect) Claim(ctx context.Context, db dbexec.DB, p store.ClaimParams) (store.Claim, error) {
	tx, err := db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return nil, fmt.Errorf("begin outbox pass: %w", err)
	}
	fail := func(err error) (store.Claim, error) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	if p.Hold > 0 {
		if _, err := tx.Exec(ctx, "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
			fmt.Sprintf("%dms", p.Hold.Milliseconds())); err != nil {
			return fail(err)
		}
	}
	rows, err := tx.Query(ctx, d.claim, p.Now, p.Limit, p.ParkKeyOnDeadLetter, p.Relay)
	if err != nil {
		return fail(err)
	}
	claimed, err := sqlstore.ScanOutboxRows(rows)
	if err != nil {
		return fail(err)
	}
	return sqlstore.NewHeldClaim(tx, claimed, d), nil
}

// LockMessage takes a connection of its own and, on it, the message's advisory lock and its
// delivery count, in one round trip.
func (d *Dialect) LockMessage(ctx context.Context, db dbexec.DB, consumer, messageID string, c store.Count) (dbexec.Conn, int, func(context.Context) bool, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	var count int
	if c.Again {
		err = conn.QueryRow(ctx, d.lockRead, consumer, messageID).Scan(&count)
	} else {
		err = conn.QueryRow(ctx, d.lockCount, consumer, messageID, c.Now, c.First).Scan(&count)
	}
	unlock := func(ctx context.Context) bool {
		var released bool
		return conn.QueryRow(ctx, d.unlock, consumer, messageID).Scan(&released) == nil && released
	}
	if err != nil {
		// The statement may have taken the lock before it failed: release, or close the session.
		conn.Release(!unlock(context.WithoutCancel(ctx)))
		return nil, 0, nil, err
	}
	return conn, count, unlock, nil
}

func (d *Dialect) Waker() store.Waker {
	if d.cfg.Listener != nil {
		return d.cfg.Listener.WakerFor(string(d.schema))
	}
	if d.cfg.ListenConnect == nil {
		return nil
	}
	return &listener{channel: d.schema.NotifyChannel(), connect: d.cfg.ListenConnect, retry: d.cfg.ListenRetry}
}

func (d *Dialect) SchemaVersion(ctx context.Context, db dbexec.DB) (current, newest int, err error) {
	err = db.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(version), 0) FROM %s.schema_migrations`, d.schema.Ident())).Scan(&current)
	return current, Newest(), err
}

func (d *Dialect) Migrate(ctx context.Context, db dbexec.DB) (store.MigrateResult, error) {
	return Migrate(ctx, db, d.schema)
}

// Classify translates Postgres errors, from pgx or lib/pq, once, at the seam.
func (d *Dialect) Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%w (%v)", store.ErrTxDone, err)
	}
	switch code, constraint := pgerr.Code(err); {
	case code == pgerr.InFailedTransaction:
		return fmt.Errorf("%w (%v)", store.ErrTxAborted, err)
	case code == pgerr.UniqueViolation && constraint == "outbox_uuid_key":
		return fmt.Errorf("%w (%v)", store.ErrDuplicateUUID, err)
	case code == pgerr.UndefinedTable:
		return fmt.Errorf("schema %s: %w (%v)", d.schema, store.ErrNotMigrated, err)
	}
	if pgerr.AccessDenied(err) {
		return outboxkit.AccessDenied(err)
	}
	if pgerr.IsUnreachable(err) {
		return outboxkit.Unreachable(err)
	}
	return err
}
