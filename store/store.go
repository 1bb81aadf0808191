// Package store is the seam between outboxkit and the database. Everything outboxkit keeps — the
// outbox, the inbox and its delivery counts, the dead letters on both sides, the idempotency keys,
// the schema's migrations — goes through the interfaces here; each driver (store/pgxstore,
// store/pgsqlstore, store/mysqlstore, store/sqlitestore) owns its SQL files, its numbered
// migrations, its claim, its per-message lock and its wake-up. No package above the seam names a
// database driver or speaks a SQL dialect.
//
// A Driver is generic over the transaction type of the team's database library, as River's
// Client[TTx] is: pgx.Tx for pgxstore, *sql.Tx for the database/sql drivers. The team writes its
// business change and its events in its own transaction; outboxkit hands a consumer's handler the
// inbox's transaction in the same type.
//
// Drivers are proven by one conformance suite, store/storetest.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Driver is a Store that also understands the application's transactions of type TTx.
type Driver[TTx any] interface {
	Store

	// UnwrapTx returns the store's view of tx, a transaction the application began on the same
	// database: outbox rows written through it commit or roll back with the application's change.
	UnwrapTx(tx TTx) Tx
}

// Store is everything outboxkit asks of a database. Its methods are safe for concurrent use.
// Errors that mean the database could not be reached are marked outboxkit.Unreachable.
type Store interface {
	// Info describes the store: its name and its schema.
	Info() Info
	// IsUnreachable reports whether err — from the store, or from the application's own statements
	// on this database — means the database could not be reached or dropped the session (a
	// failed connect, a lost connection, the server shutting down or out of connections), rather
	// than that it refused the statement.
	IsUnreachable(err error) bool

	// Migrate creates or upgrades outboxkit's tables. It is idempotent and safe to run from
	// several processes at once, and refuses a database migrated by a newer build.
	Migrate(ctx context.Context) (MigrateResult, error)
	// CheckSchema reports whether outboxkit's tables are at the version this build needs: nil
	// when they are, an error wrapping ErrNotMigrated (tables missing or behind: run Migrate) or
	// ErrNewerSchema (migrated by a newer build) that names both versions, or the database's error.
	CheckSchema(ctx context.Context) error

	// Claim takes the next outbox rows to publish, for one relay pass (see Claim).
	Claim(ctx context.Context, p ClaimParams) (Claim, error)
	// Waker returns how writers wake relays, or nil when they do not (relays poll).
	Waker() Waker
	// OutboxStats reads the outbox's backlog.
	OutboxStats(ctx context.Context, now time.Time) (OutboxStats, error)
	// OutboxDeadLetters lists dead-lettered outbox rows matching f, oldest first.
	OutboxDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// ReplayOutboxDeadLetters puts the dead-lettered rows matching f back in line with a fresh attempt budget
	// and returns them. An empty filter without All selects nothing. On Postgres the row is written
	// again (deleted and inserted, same seq, id and content), so that a log relay, which reads the
	// outbox's INSERTs, publishes it.
	ReplayOutboxDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// PrunePublished deletes at most limit rows published before cutoff and returns how many.
	PrunePublished(ctx context.Context, cutoff time.Time, limit int) (int, error)

	// Session returns the consumer operations, each on a pooled connection of its own.
	Session() Session
	// LockMessage serializes the deliveries of one message to one consumer: it waits for a lock
	// on (consumer, messageID) held for the delivery — released by the database if the process
	// dies — counts the delivery (Count) and returns the session that holds the lock.
	LockMessage(ctx context.Context, consumer, messageID string, c Count) (LockedSession, int, error)
	// RecordFirstFailure counts a first delivery that was not counted when it began (the broker
	// vouched it was the first) and failed with errText.
	RecordFirstFailure(ctx context.Context, consumer, messageID string, now time.Time, errText string) error
	// ConsumerStats reads, per consumer, what the inbox tables hold.
	ConsumerStats(ctx context.Context, now time.Time) ([]ConsumerStats, error)
	// DeadLettersWaiting reads how many of consumer's dead-lettered messages wait for a replay, and
	// how long the oldest has waited. Cheap: it reads an index of waiting letters, at every scrape.
	DeadLettersWaiting(ctx context.Context, consumer string, now time.Time) (WaitingLetters, error)
	// InboxDeadLetters lists consumers' dead-lettered messages matching f, oldest first.
	InboxDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// ResetDeliveries forgets a message's delivery count, before it is replayed.
	ResetDeliveries(ctx context.Context, consumer, messageID string) error
	// MarkReplayed records that a consumer's dead letter was sent again.
	MarkReplayed(ctx context.Context, id int64, now time.Time) error
	// PruneInbox deletes at most limit inbox rows of consumer ("" = all) processed before cutoff.
	PruneInbox(ctx context.Context, consumer string, cutoff time.Time, limit int) (int, error)
	// PruneDeliveries deletes at most limit delivery counts last seen before cutoff.
	PruneDeliveries(ctx context.Context, consumer string, cutoff time.Time, limit int) (int, error)

	// BeginIdempotency begins the transaction of an HTTP request made with an Idempotency-Key.
	BeginIdempotency(ctx context.Context) (IdempotencyTx, error)
	// IdempotencyRecord reads the recorded response of a key.
	IdempotencyRecord(ctx context.Context, scope, key string) (IdempotencyRecord, error)
}

// Info describes a store.
type Info struct {
	// Name says which driver and database: "postgres (pgx)", "mysql", "sqlite".
	Name string
	// Schema holds outboxkit's tables: a Postgres schema, a MySQL database (which MySQL also calls
	// a schema), or, on SQLite, the database file's path.
	Schema string
}

// Tx is a transaction as outboxkit uses it: the application's, or one outboxkit began.
type Tx interface {
	// InsertOutbox writes messages into the outbox in this transaction, in order: they become
	// visible to relays when, and only if, it commits. It never commits.
	InsertOutbox(ctx context.Context, msgs []OutboxMessage) error
	// User is the transaction as the application's database library sees it (pgx.Tx, *sql.Tx).
	User() any
}

// OutboxMessage is a message to write into the outbox.
type OutboxMessage struct {
	UUID         string
	Topic        string
	PartitionKey string // "" for none
	Payload      []byte
	Metadata     []byte // a JSON object of strings
}

// ClaimParams are the parameters of one relay pass's claim.
type ClaimParams struct {
	Now   time.Time
	Limit int
	// ParkKeyOnDeadLetter keeps a key's later rows back while an earlier row is dead-lettered.
	ParkKeyOnDeadLetter bool
	// Hold is how long the claim may be held before the store gives its rows to another relay:
	// a pass that stalls longer loses them (they may then be published twice, never lost).
	Hold time.Duration
	// Owner names the relay, for stores that lease rows.
	Owner string
	// Relay is the relay's name (forwarder Config.Name): a relay paused by that name claims
	// nothing, and no relay claims rows of a paused topic (see Pause). Empty: only topic pauses.
	Relay string
}

// Claim is one relay pass's hold on outbox rows: rows returned are kept from every other relay
// until Finish or Abandon. Rows come in seq order; a row is never returned while an earlier row
// of its partition key is pending outside the claim (held by another relay, backing off, or, with
// ParkKeyOnDeadLetter, dead-lettered).
type Claim interface {
	Rows() []OutboxRow
	// Finish records what the pass did and releases every claimed row.
	Finish(ctx context.Context, o Outcome) error
	// Abandon releases the claim without recording anything, as a crash would. Safe after Finish.
	Abandon(ctx context.Context)
}

// OutboxRow is a claimed outbox row.
type OutboxRow struct {
	Seq          int64
	UUID         string
	Topic        string
	PartitionKey string // "" for none
	Payload      []byte
	Metadata     []byte // as stored
	CreatedAt    time.Time
	Attempts     int
}

// Outcome is what a relay pass did with its claimed rows. Rows in neither list are released
// untouched.
type Outcome struct {
	Now time.Time
	// Published rows are marked published, or deleted with DeleteOnPublish.
	Published       []int64
	DeleteOnPublish bool
	// Failed rows count an attempt each.
	Failed []FailedRow
}

// FailedRow is a row whose publish failed because of the message.
type FailedRow struct {
	Seq   int64
	Error string
	// NextAttemptAt is when to try again; zero when the row is dead-lettered.
	NextAttemptAt time.Time
	DeadLettered  bool
}

// Waker wakes relays when writers commit rows.
type Waker interface {
	// Listen calls wake whenever rows may have been committed, and listening once it listens (and
	// again after every reconnection, since wake-ups sent meanwhile are lost). It returns when ctx
	// ends. Failures are reported to logErr and retried.
	Listen(ctx context.Context, wake, listening func(), logErr func(error))
}

// SharedListener is one wake-up connection that the relays of many stores of one database share
// (pgxstore.NewListener: one LISTEN connection for every schema), where each store would otherwise
// hold its own. A store built with one hands its relays the Waker it gives for the store's schema.
type SharedListener interface {
	// WakerFor returns the Waker of the relays of the store whose tables are in schema.
	WakerFor(schema string) Waker
}

// Awaker is implemented by a Waker whose writers can skip the wake-up while a relay says it is
// awake (Postgres: a NOTIFY costs writers under load). A relay that runs passes back to back and
// polls between them calls Awake; writers wake relays again once d has passed.
type Awaker interface {
	Awake(ctx context.Context, d time.Duration) error
}

// OutboxStats describes the outbox's backlog.
type OutboxStats struct {
	Pending            int           // rows waiting to be published (including rows backing off)
	OldestPendingAge   time.Duration // age of the oldest pending row; 0 when none
	DeadLettered       int           // rows parked after MaxAttempts, waiting for an operator
	OldestDeadLettered time.Duration // time since the oldest dead letter was parked; 0 when none
}

// DeadLetter is a message parked on either side: an outbox row dead-lettered after its publishes
// failed, or a message a consumer dead-lettered.
type DeadLetter struct {
	// ID is the outbox row's seq, or the consumer dead letter's id.
	ID int64 `json:"id"`
	// Consumer that dead-lettered it; "" for an outbox row.
	Consumer     string            `json:"consumer,omitempty"`
	Topic        string            `json:"topic"`
	MessageID    string            `json:"message_id"`
	PartitionKey string            `json:"partition_key,omitempty"`
	Payload      []byte            `json:"payload"`
	Metadata     map[string]string `json:"metadata"` // nil when the stored metadata is not a JSON object of strings
	// Reason is the last error.
	Reason string `json:"reason"`
	// Attempts: failed publishes of an outbox row, deliveries of a consumer's message.
	Attempts       int       `json:"attempts"`
	CreatedAt      time.Time `json:"created_at,omitzero"` // outbox rows: when written
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	ReplayedAt     time.Time `json:"replayed_at,omitzero"` // consumers' dead letters: zero until replayed

	// The fields below are read by the console (see Console); other listings leave them zero.

	// EventType is the message's outboxkit_event_type; "" when it has none.
	EventType string `json:"event_type,omitempty"`
	// FailureGroup is the group of its last error and event type (FailureGroupOf); 0 while not
	// grouped yet (a letter stored before the console's migration, until Console.Regroup).
	FailureGroup int64 `json:"failure_group,omitempty"`
	// ArchivedAt is when an operator archived it: it waits no more, and is never replayed.
	ArchivedAt time.Time `json:"archived_at,omitzero"`
	// PayloadSize is the payload's length in bytes, whether or not Payload holds it (or all of it).
	PayloadSize int `json:"payload_size,omitempty"`
	// SourceSeq is a consumer's letter's outbox seq (outboxkit_seq), 0 when unknown: a replay job
	// sends each key's letters in this order.
	SourceSeq int64 `json:"-"`
}

// Side is where a dead letter waits, as the console names it: SideOutbox for the outbox's (the
// relay could not publish it), otherwise the consumer's name.
func (d DeadLetter) Side() string {
	if d.Consumer == "" {
		return SideOutbox
	}
	return d.Consumer
}

// DeadLetterFilter selects dead letters. Set fields narrow the selection (they combine with AND).
type DeadLetterFilter struct {
	IDs            []int64
	MessageIDs     []string
	Consumer       string // consumers' dead letters only
	Topic          string
	PartitionKey   string // outbox rows only
	ReasonContains string
	From, Until    time.Time // dead-lettered at or after From, before Until
	// Limit bounds a listing. Default 100; negative: no bound. Replays are not limited.
	Limit int
	// IncludeReplayed also selects consumers' dead letters already replayed.
	IncludeReplayed bool
	// All must be set to replay with an otherwise empty filter, so that a forgotten flag never
	// replays everything.
	All bool
}

// Empty reports whether f names nothing to select by.
func (f DeadLetterFilter) Empty() bool {
	return len(f.IDs) == 0 && len(f.MessageIDs) == 0 && f.Consumer == "" && f.Topic == "" && f.PartitionKey == "" &&
		f.ReasonContains == "" && f.From.IsZero() && f.Until.IsZero()
}

// ErrEmptyFilter is returned by a replay with an empty filter and All unset.
var ErrEmptyFilter = errors.New("the filter is empty: name ids, message ids, a consumer, a topic, a key, " +
	"an error text or a time range, or set All")

// Count says how LockMessage counts the delivery.
type Count struct {
	Now time.Time
	// First is the count of a message seen here for the first time: 1, or 2 on a redelivery
	// whose first delivery was not counted.
	First int
	// Again is set for a delivery counted already (tried again in-process): it is read, not
	// counted a second time.
	Again bool
}

// Session is what the consumer middleware does on the database.
type Session interface {
	// Seen reports whether the consumer has processed the message (its inbox row exists).
	Seen(ctx context.Context, consumer, messageID string) (bool, error)
	// BeginInbox begins a transaction for a delivery's effect.
	BeginInbox(ctx context.Context) (InboxTx, error)
	// CountDuplicate counts a delivery absorbed by the inbox.
	CountDuplicate(ctx context.Context, consumer, messageID string) error
	// Processed reports exactly whether the consumer has processed the message: it waits for a
	// delivery of it in progress elsewhere to end.
	Processed(ctx context.Context, consumer, messageID string, now time.Time) (bool, error)
	// DeadLetter stores a consumer's dead letter. A message dead-lettered again after a replay
	// updates its row.
	DeadLetter(ctx context.Context, q InboxDeadLetter) error
}

// InboxBeginner is implemented by a Session that can begin an inbox transaction and insert a
// batch's inbox rows in one round trip (store/pgxstore: BEGIN and the INSERT in one pipeline).
// BeginInboxes is BeginInbox followed by InsertInboxes: on error nothing is left open.
type InboxBeginner interface {
	BeginInboxes(ctx context.Context, consumer string, messageIDs []string, now time.Time) (tx InboxTx, inserted map[string]bool, err error)
}

// LockedSession is a Session holding a message's lock (see Store.LockMessage).
type LockedSession interface {
	Session
	// RecordFailure records the error of the delivery in progress.
	RecordFailure(ctx context.Context, consumer, messageID, errText string) error
	// Unlock releases the lock and the session. A session that cannot say whether it released the
	// lock is closed, which releases it.
	Unlock(ctx context.Context)
}

// Parked is a message that arrived ahead of its key's turn, as the order guard keeps it.
type Parked struct {
	Consumer, Key string
	Version       int64
	MessageID     string
	Topic         string
	Payload       []byte
	Metadata      []byte // JSON object
	ParkedAt      time.Time
}

// InboxDeadLetter is a message a consumer dead-letters.
type InboxDeadLetter struct {
	Consumer, Topic, MessageID string
	Payload                    []byte
	Metadata                   []byte // JSON object
	Reason                     string
	Deliveries                 int
	Now                        time.Time
}

// InboxTx is the transaction of a delivery's effect.
type InboxTx interface {
	Tx
	// InsertInbox inserts the message's inbox row first; false when it exists (a duplicate): a
	// concurrent delivery of the same message waits for this transaction and then finds it.
	InsertInbox(ctx context.Context, consumer, messageID string, now time.Time) (inserted bool, err error)
	// InsertInboxes is InsertInbox for a batch of messages, in one statement where the database
	// allows, in sorted order (so that two batches sharing messages never deadlock); it returns
	// the ids it inserted (the others are duplicates). An id may appear more than once.
	InsertInboxes(ctx context.Context, consumer string, messageIDs []string, now time.Time) (inserted map[string]bool, err error)
	// LockVersion returns the last version applied for a key, locked for the rest of the
	// transaction; found is false for a key never seen.
	LockVersion(ctx context.Context, consumer, key string) (version int64, found bool, err error)
	// StoreVersion records the version applied for a key.
	StoreVersion(ctx context.Context, consumer, key string, version int64, now time.Time) error
	// ParkMessage keeps a message that arrived ahead of its key's turn, to be applied by the
	// transaction that applies its predecessor. A second message for the same version is not kept.
	ParkMessage(ctx context.Context, p Parked) error
	// TakeParked removes and returns the message parked for a key's version; found is false when
	// there is none.
	TakeParked(ctx context.Context, consumer, key string, version int64) (p Parked, found bool, err error)
	// DeadLetterParked dead-letters a parked message that failed for good when its turn came, and
	// removes its inbox row (written when it was parked), so that a replay of it runs.
	DeadLetterParked(ctx context.Context, q InboxDeadLetter) error
	// Savepoint marks the transaction; RollbackToSavepoint undoes what followed the mark.
	Savepoint(ctx context.Context) error
	RollbackToSavepoint(ctx context.Context) error
	Commit(ctx context.Context) error
	// Rollback is safe after Commit.
	Rollback(ctx context.Context) error
}

// ConsumerStats is what the inbox tables say about one consumer.
type ConsumerStats struct {
	Consumer    string `json:"consumer"`
	Processed   int64  `json:"processed"`    // messages processed, within the inbox retention
	Duplicates  int64  `json:"duplicates"`   // deliveries absorbed by the inbox after the first
	DeadLetters int64  `json:"dead_letters"` // dead-lettered messages waiting for a replay
	// Parked counts messages the order guard keeps until an earlier version of their key is
	// applied (inbox_parked); they are counted in Processed too.
	Parked int64 `json:"parked"`
}

// WaitingLetters is what waits in one consumer's dead letters.
type WaitingLetters struct {
	Count     int64         // dead-lettered messages not yet replayed
	OldestAge time.Duration // how long the oldest of them has waited; 0 when none
}

// IdempotencyTx is the transaction of a request made with an Idempotency-Key.
type IdempotencyTx interface {
	Tx
	// ClaimKey records the key for the request; false when it is recorded already (a retry),
	// after waiting for a request with the same key in progress to end.
	ClaimKey(ctx context.Context, scope, key string, requestHash []byte, now time.Time) (bool, error)
	// RecordResponse stores the response to send again for the key.
	RecordResponse(ctx context.Context, scope, key string, r IdempotencyRecord) error
	Commit(ctx context.Context) error
	// Rollback is safe after Commit.
	Rollback(ctx context.Context) error
}

// IdempotencyRecord is a recorded response.
type IdempotencyRecord struct {
	RequestHash []byte
	Status      int
	Headers     []byte // JSON
	Body        []byte
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	// Applied lists the versions this call applied, in order; empty when the schema was current.
	Applied []int
	// Version is the schema version after the call.
	Version int
}

// ErrNewerSchema is returned (wrapped) by Migrate for a database migrated by a newer build.
var ErrNewerSchema = errors.New("the database was migrated by a newer outboxkit: upgrade outboxkit before running it against this database")

// ErrDuplicateUUID is returned (wrapped) when a message's UUID is already in the outbox — or, from
// the publisher, repeated within one Publish call, which its error says.
var ErrDuplicateUUID = errors.New("a message with this UUID is already in the outbox; every message needs its own UUID")

// ErrTxDone is returned (wrapped) for a transaction that was already committed or rolled back.
var ErrTxDone = errors.New("the transaction is already committed or rolled back; publish inside the open transaction " +
	"that writes the business change")

// ErrTxAborted is returned (wrapped) by InsertOutbox in a transaction an earlier error aborted.
var ErrTxAborted = errors.New("the transaction was aborted by an earlier error; roll it back")

// ErrNotMigrated is returned (wrapped) when outboxkit's tables do not exist, or are at an older
// version than this build needs.
var ErrNotMigrated = errors.New("outboxkit's tables are missing or out of date: run Migrate (or `outboxctl migrate`) first")

// CheckVersion compares the version a schema's tables are at with the newest version a build
// knows: nil when equal, otherwise ErrNotMigrated or ErrNewerSchema, wrapped with both versions.
func CheckVersion(schema string, current, newest int) error {
	switch {
	case current == 0:
		return fmt.Errorf("schema %s has no outboxkit tables (this build needs version %d): %w", schema, newest, ErrNotMigrated)
	case current < newest:
		return fmt.Errorf("schema %s is at version %d, this build needs version %d: %w", schema, current, newest, ErrNotMigrated)
	case current > newest:
		return fmt.Errorf("schema %s is at version %d, this build knows versions up to %d: %w", schema, current, newest, ErrNewerSchema)
	}
	return nil
}
