// Package mysql is the MySQL 8 / MariaDB ≥ 10.6 dialect of outboxkit's store: its SQL files and
// numbered migrations, its claim (FOR UPDATE SKIP LOCKED in a read-committed transaction held by
// the pass), its per-message lock (GET_LOCK, held by the delivery's connection) and no wake-up:
// relays poll the pending rows' index.
//
// Where MySQL and MariaDB differ, the SQL keeps to what both accept: no RETURNING (MariaDB has it
// on INSERT and DELETE only, MySQL not at all), no JSON_TABLE in writes, VALUES() in upserts
// (deprecated by MySQL 8.0.20 in favour of a row alias MariaDB lacks), no partial indexes (neither
// has them), GET_LOCK names hashed under 64 characters.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

//go:embed sql/*.sql migrations/*.sql
var files embed.FS

// DefaultDatabase holds outboxkit's tables unless configured otherwise.
const DefaultDatabase = "outboxkit"

var validName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,49}$`)

// timeLayout is how times are passed: UTC, whatever the connection's time zone or loc.
const timeLayout = "2006-01-02 15:04:05.000000"

// Dialect is MySQL and MariaDB.
type Dialect struct {
	sqlstore.TextParams
	database string
	q        sqlstore.Queries
	sql      map[string]string
}

// New returns the dialect with outboxkit's tables in database ("" for DefaultDatabase).
func New(database string) (*Dialect, error) {
	if database == "" {
		database = DefaultDatabase
	}
	if !validName.MatchString(database) {
		return nil, fmt.Errorf("database name %q is not usable: use lowercase letters, digits and underscores, "+
			"start with a letter or underscore, at most 50 characters (default %q)", database, DefaultDatabase)
	}
	d := &Dialect{TextParams: sqlstore.TextParams{Layout: timeLayout}, database: database, sql: map[string]string{}}
	entries, err := files.ReadDir("sql")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		b, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		d.sql[strings.TrimSuffix(e.Name(), ".sql")] = d.render(string(b))
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
		DeadLetter: d.sql["dead_letter"], CountDelivery: d.sql["count_delivery"], CountDeliveryRead: d.sql["count_delivery_read"],
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
	return d, nil
}

// Fleet is the relay fleet's statements' view of MySQL. Its clock is the server's in UTC:
// UTC_TIMESTAMP(6), read once per statement whatever the session's time zone. MySQL has no
// RETURNING: what an upsert wrote is read back.
func (d *Dialect) Fleet() sqlstore.FleetSQL {
	return sqlstore.FleetSQL{
		Now: "UTC_TIMESTAMP(6)", Later: "(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)",
		UpsertMember: d.sql["fleet_heartbeat"], AcquireLease: d.sql["fleet_acquire_lease"], RecordOutboxes: d.sql["fleet_record_outboxes"],
	}
}

func (d *Dialect) render(sql string) string {
	return strings.ReplaceAll(sql, "{{schema}}", "`"+d.database+"`")
}

// Database is the database holding outboxkit's tables.
func (d *Dialect) Database() string { return d.database }

func (d *Dialect) Info() store.Info { return store.Info{Name: "mysql", Schema: d.database} }

func (d *Dialect) Queries() *sqlstore.Queries { return &d.q }

func (d *Dialect) Console() sqlstore.ConsoleSQL {
	return sqlstore.ConsoleSQL{
		Prefix: "`" + d.database + "`.", OutboxID: "uuid", DeadWaiting: "waiting = 1", OutboxScanHint: " FORCE INDEX (outbox_dead_lettered_idx)",
		Contains: "LOCATE(%[2]s, %[1]s) > 0", ForUpdate: " FOR UPDATE",
		InsertIgnore: "INSERT IGNORE INTO",
		UpsertRelay: `INSERT INTO {{schema}}.relays (owner, name, host, pid, started_at, heartbeat_at, last_pass_at, last_publish_at,
    circuit_open_since, blocked, published_total, published_by_topic, pauses_seen_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at), last_pass_at = VALUES(last_pass_at),
    last_publish_at = VALUES(last_publish_at), circuit_open_since = VALUES(circuit_open_since), blocked = VALUES(blocked),
    published_total = VALUES(published_total), published_by_topic = VALUES(published_by_topic),
    pauses_seen_at = VALUES(pauses_seen_at)`,
	}
}

func (d *Dialect) MarkFailed(ctx context.Context, q dbexec.Querier, rows []store.FailedRow, now time.Time, extra []any) error {
	// Failures are rare: one small statement per row, in the pass's transaction.
	for _, r := range rows {
		var next, dead any
		if r.DeadLettered {
			dead = d.Time(now)
		} else {
			next = d.Time(r.NextAttemptAt)
		}
		if _, err := q.Exec(ctx, d.sql["mark_failed"], append([]any{r.Seq, r.Error, next, dead}, extra...)...); err != nil {
			return err
		}
	}
	return nil
}

// maxMessagesPerInsert keeps one INSERT under MySQL's 65,535 placeholders (five per row).
const maxMessagesPerInsert = 65535 / 5

func (d *Dialect) InsertOutbox(ctx context.Context, q dbexec.Querier, msgs []store.OutboxMessage) error {
	if len(msgs) > maxMessagesPerInsert {
		return fmt.Errorf("%d messages in one call; split them into calls of at most %d", len(msgs), maxMessagesPerInsert)
	}
	var b strings.Builder
	b.WriteString(d.sql["insert_outbox"])
	args := make([]any, 0, 5*len(msgs))
	for i, m := range msgs {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&b, "(?%d, ?%d, ?%d, ?%d, ?%d, UTC_TIMESTAMP(6))", n+1, n+2, n+3, n+4, n+5)
		var key any
		if m.PartitionKey != "" {
			key = m.PartitionKey
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		args = append(args, m.UUID, m.Topic, key, payload, string(m.Metadata))
	}
	_, err := q.Exec(ctx, b.String(), args...)
	return err
}

// Claim locks the window in a read-committed transaction (repeatable read's gap locks would block
// the writers' inserts behind it) and keeps, per key, the rows before the key's first pending row
// outside the window.
func (d *Dialect) Claim(ctx context.Context, db dbexec.DB, p store.ClaimParams) (store.Claim, error) {
	tx, err := db.Begin(ctx, dbexec.TxOptions{ReadCommitted: true})
	if err != nil {
		return nil, fmt.Errorf("begin outbox pass: %w", err)
	}
	fail := func(err error) (store.Claim, error) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	rows, err := tx.Query(ctx, d.sql["claim_window"], d.Time(p.Now), p.ParkKeyOnDeadLetter, p.Limit, p.Relay)
	if err != nil {
		return fail(err)
	}
	window, err := sqlstore.ScanOutboxRows(rows)
	if err != nil {
		return fail(err)
	}
	gaps, err := d.gaps(ctx, tx, window, p.ParkKeyOnDeadLetter)
	if err != nil {
		return fail(err)
	}
	kept, _ := sqlstore.KeepBeforeGaps(window, gaps)
	return sqlstore.NewHeldClaim(tx, kept, d), nil
}

func (d *Dialect) gaps(ctx context.Context, q dbexec.Querier, window []store.OutboxRow, park bool) (map[string]int64, error) {
	return sqlstore.QueryGaps(ctx, q, d.sql["claim_gaps"], window, park)
}

// LockMessage takes a connection and, on it, GET_LOCK on the message (named by a hash: lock names
// are at most 64 characters), then counts the delivery.
func (d *Dialect) LockMessage(ctx context.Context, db dbexec.DB, consumer, messageID string, c store.Count) (dbexec.Conn, int, func(context.Context) bool, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	name := "outboxkit:" + d.database + ":" + consumer + "\x1f" + messageID
	var got sql.NullInt64
	// A year: GET_LOCK's wait is bounded by the caller's context (the driver drops the connection,
	// and the server the wait with it, when it ends).
	if err := conn.QueryRow(ctx, "SELECT GET_LOCK(SHA1(?1), 31536000)", name).Scan(&got); err != nil || got.Int64 != 1 {
		conn.Release(true)
		if err == nil {
			err = fmt.Errorf("GET_LOCK on message %s returned %v", messageID, got)
		}
		return nil, 0, nil, err
	}
	unlock := func(ctx context.Context) bool {
		var released sql.NullInt64
		return conn.QueryRow(ctx, "SELECT RELEASE_LOCK(SHA1(?1))", name).Scan(&released) == nil && released.Int64 == 1
	}
	count, err := sqlstore.CountDelivery(ctx, conn, d, consumer, messageID, c)
	if err != nil {
		conn.Release(!unlock(context.WithoutCancel(ctx)))
		return nil, 0, nil, err
	}
	return conn, count, unlock, nil
}

// Waker is nil: MySQL has nothing like NOTIFY; relays poll the pending index.
func (d *Dialect) Waker() store.Waker { return nil }

// CheckVersion refuses a server without FOR UPDATE SKIP LOCKED.
func (d *Dialect) CheckVersion(ctx context.Context, db dbexec.DB) error {
	var version string
	if err := db.QueryRow(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return err
	}
	return checkVersion(version)
}

func checkVersion(version string) error {
	nums := regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?`).FindStringSubmatch(version)
	if nums == nil {
		return fmt.Errorf("cannot read the server version %q", version)
	}
	major, _ := strconv.Atoi(nums[1])
	minor, _ := strconv.Atoi(nums[2])
	patch, _ := strconv.Atoi(nums[3])
	at := func(a, b, c int) bool { return major > a || major == a && (minor > b || minor == b && patch >= c) }
	if strings.Contains(strings.ToLower(version), "mariadb") {
		if !at(10, 6, 0) {
			return fmt.Errorf("MariaDB %s has no FOR UPDATE SKIP LOCKED, which relays claim rows with: outboxkit needs MariaDB 10.6 or newer", version)
		}
		return nil
	}
	if !at(8, 0, 1) {
		return fmt.Errorf("MySQL %s has no FOR UPDATE SKIP LOCKED, which relays claim rows with: outboxkit needs MySQL 8.0.1 or newer", version)
	}
	return nil
}

// statements splits a migration into its statements as the mysql client does: each ends with
// ";" at the end of a line, or with the delimiter a DELIMITER line sets, which a procedure needs
// around its body (whose statements end with ";"). The delimiter is not sent.
func statements(sql string) []string {
	var out []string
	delimiter, section := ";", ""
	flush := func() {
		if delimiter == ";" {
			out = append(out, sqlstore.Statements(section)...)
		} else {
			for _, stmt := range strings.Split(section, delimiter+"\n") {
				if stmt = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(stmt), delimiter)); stmt != "" {
					out = append(out, stmt)
				}
			}
		}
		section = ""
	}
	for _, line := range strings.SplitAfter(sql, "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.EqualFold(f[0], "DELIMITER") {
			flush()
			delimiter = f[1]
			continue
		}
		section += line
	}
	flush()
	return out
}

// alreadyApplied reports whether a migration statement failed only because a run cut short had
// applied it: MySQL 8 has no ADD COLUMN IF NOT EXISTS (MariaDB has), and DDL commits by itself.
func alreadyApplied(err error) bool {
	var me *gomysql.MySQLError
	// ER_DUP_FIELDNAME, ER_DUP_KEYNAME
	return errors.As(err, &me) && (me.Number == 1060 || me.Number == 1061)
}

// Classify translates MySQL errors once, at the seam.
func (d *Dialect) Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w (%v)", store.ErrTxDone, err)
	}
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1062: // ER_DUP_ENTRY
			if strings.Contains(me.Message, "outbox_uuid_key") {
				return fmt.Errorf("%w (%v)", store.ErrDuplicateUUID, err)
			}
		case 1045, 1044, 1142, 1143, 1227, 1698: // access denied: user, database, table, column, privilege, auth plugin
			return outboxkit.AccessDenied(err)
		case 1146, 1049: // ER_NO_SUCH_TABLE, ER_BAD_DB_ERROR
			return fmt.Errorf("database %s: %w (%v)", d.database, store.ErrNotMigrated, err)
		case 1040, 1053, 1077, 1152, 1153, 1158, 1159, 1160, 1161, 2002, 2003, 2006, 2013, 1927:
			// too many connections, server shutdown, aborted connection, lost connection, killed
			return outboxkit.Unreachable(err)
		}
		return err
	}
	if errors.Is(err, gomysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || outboxkit.IsUnreachable(err) {
		return outboxkit.Unreachable(err)
	}
	return err
}

func (d *Dialect) SchemaVersion(ctx context.Context, db dbexec.DB) (current, newest int, err error) {
	migrations := sqlstore.ParseMigrations(files, "migrations")
	err = db.QueryRow(ctx, d.render("SELECT COALESCE(MAX(version), 0) FROM {{schema}}.schema_migrations")).Scan(&current)
	return current, migrations[len(migrations)-1].Version, err
}

// Migrate brings outboxkit's tables to the newest version. DDL commits by itself in MySQL, so a
// migration cannot share a transaction with its version row: processes serialize on GET_LOCK for
// the database, every statement is idempotent (CREATE … IF NOT EXISTS, indexes declared with their
// tables), and a migration cut short is run again whole.
func (d *Dialect) Migrate(ctx context.Context, db dbexec.DB) (store.MigrateResult, error) {
	var res store.MigrateResult
	if err := d.CheckVersion(ctx, db); err != nil {
		return res, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return res, err
	}
	lock := "outboxkit.migrate." + d.database
	var got sql.NullInt64
	if err := conn.QueryRow(ctx, "SELECT GET_LOCK(?1, 600)", lock).Scan(&got); err != nil || got.Int64 != 1 {
		conn.Release(true)
		if err == nil {
			err = errors.New("another process held the migration lock for 10 minutes")
		}
		return res, fmt.Errorf("migrate database %s: %w", d.database, err)
	}
	defer func() {
		var released sql.NullInt64
		ok := conn.QueryRow(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?1)", lock).Scan(&released) == nil
		conn.Release(!ok)
	}()
	for _, stmt := range []string{
		"CREATE DATABASE IF NOT EXISTS `" + d.database + "` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
		d.render(`CREATE TABLE IF NOT EXISTS {{schema}}.schema_migrations (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL
) ENGINE = InnoDB`),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return res, fmt.Errorf("migrate database %s: create version table: %w", d.database, err)
		}
	}
	migrations := sqlstore.ParseMigrations(files, "migrations")
	newest := migrations[len(migrations)-1].Version
	for _, m := range migrations {
		var present int
		if err := conn.QueryRow(ctx, d.render("SELECT COUNT(*) FROM {{schema}}.schema_migrations WHERE version = ?1"), m.Version).Scan(&present); err != nil {
			return res, fmt.Errorf("migrate database %s: %w", d.database, err)
		}
		if present > 0 {
			continue
		}
		for _, stmt := range statements(d.render(m.SQL)) {
			if _, err := conn.Exec(ctx, stmt); err != nil && !alreadyApplied(err) {
				return res, fmt.Errorf("migrate database %s: apply %04d_%s: %w", d.database, m.Version, m.Name, err)
			}
		}
		if _, err := conn.Exec(ctx, d.render("INSERT INTO {{schema}}.schema_migrations (version, name, applied_at) VALUES (?1, ?2, UTC_TIMESTAMP(6))"),
			m.Version, m.Name); err != nil {
			return res, fmt.Errorf("migrate database %s: record %04d_%s: %w", d.database, m.Version, m.Name, err)
		}
		res.Applied = append(res.Applied, m.Version)
	}
	if err := conn.QueryRow(ctx, d.render("SELECT COALESCE(MAX(version), 0) FROM {{schema}}.schema_migrations")).Scan(&res.Version); err != nil {
		return res, fmt.Errorf("migrate database %s: read version: %w", d.database, err)
	}
	if res.Version > newest {
		return res, fmt.Errorf("migrate database %s: the database is at version %d but this build knows migrations up to %d: %w",
			d.database, res.Version, newest, store.ErrNewerSchema)
	}
	return res, nil
}
