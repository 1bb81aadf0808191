// Package sqlstore implements store.Store once, for every SQL database, over a Dialect: the
// dialect brings its SQL text (its own files, placeholders and schema) and the few things that
// differ beyond text — how rows are claimed, how a message is locked, how relays are woken, how
// migrations run, how its errors read — and sqlstore does the rest the same way everywhere.
package sqlstore

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// Dialect is what a database brings.
type Dialect interface {
	// Info names the store.
	Info() store.Info
	// Queries returns the dialect's statements, rendered for its schema.
	Queries() *Queries

	// Args converts values into the dialect's parameters.
	Int64s(v []int64) any
	Strings(v []string) any
	Time(t time.Time) any
	// NullTime is Time, or NULL for the zero time.
	NullTime(t time.Time) any
	// MarkFailed records message-specific failures: attempts+1, the error, the next attempt or,
	// for a row dead-lettered, now; extra follows each statement's own parameters (a lease's
	// owner).
	MarkFailed(ctx context.Context, q dbexec.Querier, rows []store.FailedRow, now time.Time, extra []any) error

	// InsertOutbox writes msgs in one statement where it can.
	InsertOutbox(ctx context.Context, q dbexec.Querier, msgs []store.OutboxMessage) error
	// Claim takes the next rows to publish (see store.Claim).
	Claim(ctx context.Context, db dbexec.DB, p store.ClaimParams) (store.Claim, error)
	// LockMessage takes a connection holding the lock of (consumer, messageID) and counts the
	// delivery on it (CountDelivery does it with the dialect's statements); unlock releases the
	// lock and reports whether it is known to be released.
	LockMessage(ctx context.Context, db dbexec.DB, consumer, messageID string, c store.Count) (conn dbexec.Conn, count int, unlock func(context.Context) bool, err error)
	// Waker wakes relays, or is nil.
	Waker() store.Waker
	// Migrate brings the schema to the newest version.
	Migrate(ctx context.Context, db dbexec.DB) (store.MigrateResult, error)
	// SchemaVersion reads the version the tables are at (0 when outboxkit's tables do not exist)
	// and the newest version this build knows.
	SchemaVersion(ctx context.Context, db dbexec.DB) (current, newest int, err error)
	// Console is what the console's statements (written once, in sqlstore) need of the dialect.
	Console() ConsoleSQL
	// Fleet is what a relay fleet's statements (written in sqlstore, but for three upserts) need
	// of the dialect.
	Fleet() FleetSQL
	// Classify translates a driver error once, at the seam: unreachable → outboxkit.Unreachable,
	// a duplicate outbox UUID → store.ErrDuplicateUUID, a finished or aborted transaction, missing
	// tables → store.ErrNotMigrated; others unchanged.
	Classify(err error) error
}

// Queries are a dialect's statements. Each names its parameters in order; a dialect whose
// placeholders cannot repeat a parameter arranges for each to be passed once.
type Queries struct {
	// OutboxStats() → pending count, oldest pending created_at, dead-lettered count, oldest dead_lettered_at.
	OutboxStats string
	// OutboxDeadLetters(ids, uuids, topic, key, reason, from, until, limit) → DeadLetter columns (outbox).
	OutboxDeadLetters string
	// LockOutboxDeadLetters(ids, uuids, topic, key, reason, from, until) → the same, locked for a replay.
	LockOutboxDeadLetters string
	// ReplayOutbox(seqs): back in line with a fresh attempt budget.
	ReplayOutbox string
	// PrunePublished(cutoff, limit).
	PrunePublished string
	// MarkPublished(now, seqs); DeletePublished(seqs).
	MarkPublished, DeletePublished string
	// MarkCommitted(now, seqs); DeleteCommitted(seqs): pending rows only, whoever holds them.
	MarkCommitted, DeleteCommitted string

	// Seen(consumer, id) → bool.
	Seen string
	// InsertInbox(consumer, id, now): 1 row affected when inserted, 0 when present.
	InsertInbox string
	// InsertInboxes(consumer, ids, now) → the ids inserted, in one statement; "": InsertInbox once
	// per id.
	InsertInboxes string
	// CountDuplicate(consumer, id).
	CountDuplicate string
	// DeadLetter(consumer, topic, id, payload, metadata, reason, deliveries, now).
	DeadLetter string
	// CountDelivery(consumer, id, now, first) → deliveries; with CountDeliveryRead(consumer, id)
	// as a second statement where the first returns nothing.
	CountDelivery, CountDeliveryRead string
	// DeliveryCount(consumer, id) → deliveries (1 when none is recorded).
	DeliveryCount string
	// DeliveryFailed(consumer, id, error).
	DeliveryFailed string
	// FirstDeliveryFailed(consumer, id, now, error).
	FirstDeliveryFailed string
	// ConsumerStats() → consumer, processed, duplicates, dead letters.
	ConsumerStats string
	// DeadLettersWaiting(consumer) → count, oldest dead_lettered_at (NULL when none).
	DeadLettersWaiting string
	// InboxDeadLetters(ids, message ids, consumer, topic, reason, from, until, include replayed, limit) → DeadLetter columns (inbox).
	InboxDeadLetters string
	// ResetDeliveries(consumer, id); MarkReplayed(id, now).
	ResetDeliveries, MarkReplayed string
	// PruneInbox(consumer, cutoff, limit); PruneDeliveries(consumer, cutoff, limit).
	PruneInbox, PruneDeliveries string
	// LockVersion(consumer, key) → version; StoreVersion(consumer, key, version, now).
	LockVersion, StoreVersion string
	// VersionPlaceholder(consumer, key, now): a row at version 0 for a key never seen.
	VersionPlaceholder string
	// ParkMessage(consumer, key, version, id, topic, payload, metadata, now); nothing when one is
	// parked for that version already.
	ParkMessage string
	// TakeParked(consumer, key, version) → id, topic, payload, metadata, parked_at: the row
	// removed (Postgres: DELETE … RETURNING), or locked and then removed by DeleteParked(consumer,
	// key, version) where DeleteParked is set.
	TakeParked, DeleteParked string
	// ForgetInbox(consumer, id).
	ForgetInbox string

	// ClaimKey(key, scope, hash, now): 1 row affected when claimed.
	ClaimKey string
	// RecordResponse(scope, key, status, headers, body).
	RecordResponse string
	// LookupKey(scope, key) → hash, status, headers, body.
	LookupKey string
}

// TextParams is the part of a Dialect shared by databases without arrays that are given times as
// text (MySQL, SQLite): lists expand in place (dbexec.Numbered), times are UTC in Layout.
type TextParams struct{ Layout string }

func (p TextParams) Int64s(v []int64) any   { return dbexec.ListOf(v) }
func (p TextParams) Strings(v []string) any { return dbexec.ListOf(v) }
func (p TextParams) Time(t time.Time) any   { return t.UTC().Format(p.Layout) }
func (p TextParams) NullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return p.Time(t)
}
