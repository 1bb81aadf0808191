package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// Store is store.Store over a DB and a Dialect.
type Store struct {
	db dbexec.DB
	d  Dialect
	q  *Queries
}

var _ store.Store = (*Store)(nil)

// New returns the store of db in dialect d.
func New(db dbexec.DB, d Dialect) *Store { return &Store{db: db, d: d, q: d.Queries()} }

// DB is the store's connection pool.
func (s *Store) DB() dbexec.DB { return s.db }

// Dialect is the store's dialect.
func (s *Store) Dialect() Dialect { return s.d }

// UnwrapTx is the store's view of an application's transaction.
func (s *Store) UnwrapTx(tx dbexec.Tx) store.Tx { return userTx{s: s, tx: tx} }

// IsUnreachable reports whether the dialect reads err as the database failing to answer.
func (s *Store) IsUnreachable(err error) bool {
	return err != nil && outboxkit.IsUnreachable(s.d.Classify(err))
}

func (s *Store) Info() store.Info { return s.d.Info() }

// Classify translates a driver error the way the store's own errors are: unreachable, access
// denied, missing tables (see Dialect.Classify).
func (s *Store) Classify(err error) error { return s.d.Classify(err) }

func (s *Store) Migrate(ctx context.Context) (store.MigrateResult, error) {
	res, err := s.d.Migrate(ctx, s.db)
	return res, s.d.Classify(err)
}

func (s *Store) SchemaVersion(ctx context.Context) (current, newest int, err error) {
	current, newest, err = s.d.SchemaVersion(ctx, s.db)
	if err != nil {
		if err = s.d.Classify(err); errors.Is(err, store.ErrNotMigrated) {
			return 0, newest, nil
		}
	}
	return current, newest, err
}

func (s *Store) CheckSchema(ctx context.Context) error {
	current, newest, err := s.d.SchemaVersion(ctx, s.db)
	if err != nil {
		if err = s.d.Classify(err); !errors.Is(err, store.ErrNotMigrated) {
			return fmt.Errorf("read the schema version of %s: %w", s.d.Info().Schema, err)
		}
		current = 0
	}
	return store.CheckVersion(s.d.Info().Schema, current, newest)
}

func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	c, err := s.d.Claim(ctx, s.db, p)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", s.d.Classify(err))
	}
	return c, nil
}

func (s *Store) Waker() store.Waker {
	w := s.d.Waker()
	if a, ok := s.d.(awakeDialect); ok && w != nil {
		return awakeWaker{Waker: w, awake: func(ctx context.Context, d time.Duration) error {
			return s.d.Classify(a.Awake(ctx, s.db, d))
		}}
	}
	return w
}

// awakeDialect is a dialect whose writers skip the wake-up while a relay says it is awake.
type awakeDialect interface {
	Awake(ctx context.Context, q dbexec.Querier, d time.Duration) error
}

type awakeWaker struct {
	store.Waker
	awake func(context.Context, time.Duration) error
}

func (w awakeWaker) Awake(ctx context.Context, d time.Duration) error { return w.awake(ctx, d) }

func (s *Store) OutboxStats(ctx context.Context, now time.Time) (store.OutboxStats, error) {
	var (
		st                     store.OutboxStats
		oldestPending, oldDead dbexec.Time
	)
	if err := s.db.QueryRow(ctx, s.q.OutboxStats).Scan(&st.Pending, &oldestPending, &st.DeadLettered, &oldDead); err != nil {
		return store.OutboxStats{}, fmt.Errorf("read outbox stats: %w", s.d.Classify(err))
	}
	if !oldestPending.IsZero() {
		st.OldestPendingAge = max(0, now.Sub(oldestPending.Time))
	}
	if !oldDead.IsZero() {
		st.OldestDeadLettered = max(0, now.Sub(oldDead.Time))
	}
	return st, nil
}

func (s *Store) outboxFilterArgs(f store.DeadLetterFilter) []any {
	return []any{s.d.Int64s(f.IDs), s.d.Strings(f.MessageIDs), f.Topic, f.PartitionKey, f.ReasonContains,
		s.d.NullTime(f.From), s.d.NullTime(f.Until)}
}

// limit is a listing's bound: 100 by default, none (as large as the databases take) when negative.
func limit(n int) int {
	switch {
	case n == 0:
		return 100
	case n < 0:
		return math.MaxInt32
	}
	return n
}

func (s *Store) OutboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	f.Limit = limit(f.Limit)
	letters, err := s.outboxDeadLetters(ctx, s.db, s.q.OutboxDeadLetters, append(s.outboxFilterArgs(f), f.Limit))
	if err != nil {
		return nil, fmt.Errorf("list outbox dead letters: %w", err)
	}
	return letters, nil
}

func (s *Store) outboxDeadLetters(ctx context.Context, q dbexec.Querier, query string, args []any) ([]store.DeadLetter, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, s.d.Classify(err)
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var (
			created, deadAt dbexec.Time
			metadata        []byte
			key             *string // NULL: no partition key
			letter          store.DeadLetter
		)
		if err := rows.Scan(&letter.ID, &letter.MessageID, &letter.Topic, &key, &letter.Payload, &metadata,
			&letter.Attempts, &letter.Reason, &created, &deadAt); err != nil {
			return nil, s.d.Classify(err)
		}
		if key != nil {
			letter.PartitionKey = *key
		}
		letter.CreatedAt, letter.DeadLetteredAt = created.Time, deadAt.Time
		letter.Metadata = decodeMetadata(metadata)
		out = append(out, letter)
	}
	return out, s.d.Classify(rows.Err())
}

func decodeMetadata(raw []byte) map[string]string {
	var md map[string]string
	if json.Unmarshal(raw, &md) != nil {
		return nil // not an object of strings: the reason it was dead-lettered, likely
	}
	return md
}

func (s *Store) ReplayOutboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	if f.Empty() && !f.All {
		return nil, fmt.Errorf("replay outbox dead letters: %w", store.ErrEmptyFilter)
	}
	var letters []store.DeadLetter
	err := s.inTx(ctx, func(tx dbexec.Tx) error {
		var err error
		letters, err = s.outboxDeadLetters(ctx, tx, s.q.LockOutboxDeadLetters, s.outboxFilterArgs(f))
		if err != nil || len(letters) == 0 {
			return err
		}
		seqs := make([]int64, len(letters))
		for i, l := range letters {
			seqs[i] = l.ID
		}
		_, err = tx.Exec(ctx, s.q.ReplayOutbox, s.d.Int64s(seqs))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("replay outbox dead letters: %w", err)
	}
	return letters, nil
}

func (s *Store) PrunePublished(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	n, err := s.db.Exec(ctx, s.q.PrunePublished, s.d.Time(cutoff), limit)
	if err != nil {
		return 0, fmt.Errorf("prune published outbox rows: %w", s.d.Classify(err))
	}
	return int(n), nil
}

// inTx runs fn in a transaction of the pool, committing when it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(dbexec.Tx) error) error {
	tx, err := s.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return s.d.Classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return s.d.Classify(err)
	}
	return s.d.Classify(tx.Commit(ctx))
}

func (s *Store) Session() store.Session { return session{s: s, db: s.db} }

func (s *Store) LockMessage(ctx context.Context, consumer, messageID string, c store.Count) (store.LockedSession, int, error) {
	conn, count, unlock, err := s.d.LockMessage(ctx, s.db, consumer, messageID, c)
	if err != nil {
		return nil, 0, fmt.Errorf("lock and count delivery of message %s: %w", messageID, s.d.Classify(err))
	}
	return &lockedSession{session: session{s: s, db: conn}, conn: conn, unlock: unlock}, count, nil
}

// CountDelivery counts a delivery (or reads the count of one counted already) with the dialect's
// statements, on the connection that holds the message's lock.
func CountDelivery(ctx context.Context, q dbexec.Querier, d Dialect, consumer, messageID string, c store.Count) (int, error) {
	qs := d.Queries()
	var n int
	if c.Again {
		err := q.QueryRow(ctx, qs.DeliveryCount, consumer, messageID).Scan(&n)
		return n, err
	}
	if qs.CountDeliveryRead == "" {
		err := q.QueryRow(ctx, qs.CountDelivery, consumer, messageID, d.Time(c.Now), c.First).Scan(&n)
		return n, err
	}
	if _, err := q.Exec(ctx, qs.CountDelivery, consumer, messageID, d.Time(c.Now), c.First); err != nil {
		return 0, err
	}
	err := q.QueryRow(ctx, qs.CountDeliveryRead, consumer, messageID).Scan(&n)
	return n, err
}

func (s *Store) RecordFirstFailure(ctx context.Context, consumer, messageID string, now time.Time, errText string) error {
	if _, err := s.db.Exec(ctx, s.q.FirstDeliveryFailed, consumer, messageID, s.d.Time(now), errText); err != nil {
		return fmt.Errorf("record the failed first delivery of %s: %w", messageID, s.d.Classify(err))
	}
	return nil
}

func (s *Store) ConsumerStats(ctx context.Context, _ time.Time) ([]store.ConsumerStats, error) {
	rows, err := s.db.Query(ctx, s.q.ConsumerStats)
	if err != nil {
		return nil, fmt.Errorf("consumer stats: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.ConsumerStats
	for rows.Next() {
		var c store.ConsumerStats
		if err := rows.Scan(&c.Consumer, &c.Processed, &c.Duplicates, &c.DeadLetters, &c.Parked); err != nil {
			return nil, fmt.Errorf("consumer stats: %w", s.d.Classify(err))
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("consumer stats: %w", s.d.Classify(err))
	}
	return out, nil
}

func (s *Store) DeadLettersWaiting(ctx context.Context, consumer string, now time.Time) (store.WaitingLetters, error) {
	var (
		w      store.WaitingLetters
		oldest dbexec.Time
	)
	if err := s.db.QueryRow(ctx, s.q.DeadLettersWaiting, consumer).Scan(&w.Count, &oldest); err != nil {
		return store.WaitingLetters{}, fmt.Errorf("dead letters waiting for %s: %w", consumer, s.d.Classify(err))
	}
	if !oldest.IsZero() {
		w.OldestAge = max(0, now.Sub(oldest.Time))
	}
	return w, nil
}

func (s *Store) InboxDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetter, error) {
	f.Limit = limit(f.Limit)
	rows, err := s.db.Query(ctx, s.q.InboxDeadLetters, s.d.Int64s(f.IDs), s.d.Strings(f.MessageIDs), f.Consumer, f.Topic,
		f.ReasonContains, s.d.NullTime(f.From), s.d.NullTime(f.Until), f.IncludeReplayed, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.DeadLetter
	for rows.Next() {
		var (
			letter           store.DeadLetter
			metadata         []byte
			deadAt, replayed dbexec.Time
		)
		if err := rows.Scan(&letter.ID, &letter.Consumer, &letter.Topic, &letter.MessageID, &letter.Payload, &metadata,
			&letter.Reason, &letter.Attempts, &deadAt, &replayed); err != nil {
			return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
		}
		letter.DeadLetteredAt, letter.ReplayedAt = deadAt.Time, replayed.Time
		letter.Metadata = decodeMetadata(metadata)
		out = append(out, letter)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", s.d.Classify(err))
	}
	return out, nil
}

func (s *Store) ResetDeliveries(ctx context.Context, consumer, messageID string) error {
	_, err := s.db.Exec(ctx, s.q.ResetDeliveries, consumer, messageID)
	return s.d.Classify(err)
}

func (s *Store) MarkReplayed(ctx context.Context, id int64, now time.Time) error {
	_, err := s.db.Exec(ctx, s.q.MarkReplayed, id, s.d.Time(now))
	return s.d.Classify(err)
}

func (s *Store) PruneInbox(ctx context.Context, consumer string, cutoff time.Time, limit int) (int, error) {
	n, err := s.db.Exec(ctx, s.q.PruneInbox, consumer, s.d.Time(cutoff), limit)
	return int(n), s.d.Classify(err)
}

func (s *Store) PruneDeliveries(ctx context.Context, consumer string, cutoff time.Time, limit int) (int, error) {
	n, err := s.db.Exec(ctx, s.q.PruneDeliveries, consumer, s.d.Time(cutoff), limit)
	return int(n), s.d.Classify(err)
}

func (s *Store) BeginIdempotency(ctx context.Context) (store.IdempotencyTx, error) {
	tx, err := s.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return nil, s.d.Classify(err)
	}
	return idempotencyTx{userTx{s: s, tx: tx}}, nil
}

func (s *Store) IdempotencyRecord(ctx context.Context, scope, key string) (store.IdempotencyRecord, error) {
	var (
		r       store.IdempotencyRecord
		headers string
	)
	err := s.db.QueryRow(ctx, s.q.LookupKey, scope, key).Scan(&r.RequestHash, &r.Status, &headers, &r.Body)
	r.Headers = []byte(headers)
	return r, s.d.Classify(err)
}

// userTx is a transaction as outboxkit uses it.
type userTx struct {
	s  *Store
	tx dbexec.Tx
}

func (t userTx) InsertOutbox(ctx context.Context, msgs []store.OutboxMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	return t.s.d.Classify(t.s.d.InsertOutbox(ctx, t.tx, msgs))
}

func (t userTx) User() any { return t.tx.User() }

func (t userTx) Commit(ctx context.Context) error   { return t.s.d.Classify(t.tx.Commit(ctx)) }
func (t userTx) Rollback(ctx context.Context) error { return t.s.d.Classify(t.tx.Rollback(ctx)) }

type idempotencyTx struct{ userTx }

func (t idempotencyTx) ClaimKey(ctx context.Context, scope, key string, hash []byte, now time.Time) (bool, error) {
	n, err := t.tx.Exec(ctx, t.s.q.ClaimKey, key, scope, hash, t.s.d.Time(now))
	return n == 1, t.s.d.Classify(err)
}

func (t idempotencyTx) RecordResponse(ctx context.Context, scope, key string, r store.IdempotencyRecord) error {
	_, err := t.tx.Exec(ctx, t.s.q.RecordResponse, scope, key, r.Status, string(r.Headers), r.Body)
	return t.s.d.Classify(err)
}

// sessionDB is the pool or a held connection.
type sessionDB interface {
	dbexec.Querier
	Begin(ctx context.Context, opts dbexec.TxOptions) (dbexec.Tx, error)
}

type session struct {
	s  *Store
	db sessionDB
}

func (se session) Seen(ctx context.Context, consumer, messageID string) (bool, error) {
	var seen bool
	err := se.db.QueryRow(ctx, se.s.q.Seen, consumer, messageID).Scan(&seen)
	return seen, se.s.d.Classify(err)
}

func (se session) BeginInbox(ctx context.Context) (store.InboxTx, error) {
	tx, err := se.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return nil, se.s.d.Classify(err)
	}
	return inboxTx{userTx{s: se.s, tx: tx}}, nil
}

func (se session) CountDuplicate(ctx context.Context, consumer, messageID string) error {
	_, err := se.db.Exec(ctx, se.s.q.CountDuplicate, consumer, messageID)
	return se.s.d.Classify(err)
}

func (se session) Processed(ctx context.Context, consumer, messageID string, now time.Time) (bool, error) {
	tx, err := se.db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return false, se.s.d.Classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := tx.Exec(ctx, se.s.q.InsertInbox, consumer, messageID, se.s.d.Time(now))
	if err != nil {
		return false, se.s.d.Classify(err)
	}
	return n == 0, nil
}

func (se session) DeadLetter(ctx context.Context, q store.InboxDeadLetter) error {
	payload := q.Payload
	if payload == nil {
		payload = []byte{}
	}
	f := FactsOf(q.Metadata, q.Reason)
	_, err := se.db.Exec(ctx, se.s.q.DeadLetter, q.Consumer, q.Topic, q.MessageID, payload, string(q.Metadata), q.Reason,
		q.Deliveries, se.s.d.Time(q.Now), f.PartitionKey, f.EventType, f.FailureGroup, f.SourceSeq)
	if err != nil {
		return fmt.Errorf("dead-letter message %s: %w", q.MessageID, se.s.d.Classify(err))
	}
	return nil
}

type lockedSession struct {
	session
	conn   dbexec.Conn
	unlock func(context.Context) bool
}

func (ls *lockedSession) RecordFailure(ctx context.Context, consumer, messageID, errText string) error {
	_, err := ls.db.Exec(ctx, ls.s.q.DeliveryFailed, consumer, messageID, errText)
	return ls.s.d.Classify(err)
}

func (ls *lockedSession) Unlock(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	released := ls.unlock(uctx)
	ls.conn.Release(!released)
}

type inboxTx struct{ userTx }

func (t inboxTx) InsertInbox(ctx context.Context, consumer, messageID string, now time.Time) (bool, error) {
	n, err := t.tx.Exec(ctx, t.s.q.InsertInbox, consumer, messageID, t.s.d.Time(now))
	return n == 1, t.s.d.Classify(err)
}

func (t inboxTx) InsertInboxes(ctx context.Context, consumer string, messageIDs []string, now time.Time) (map[string]bool, error) {
	if t.s.q.InsertInboxes == "" {
		ids := slices.Compact(slices.Sorted(slices.Values(messageIDs)))
		inserted := make(map[string]bool, len(ids))
		for _, id := range ids {
			n, err := t.tx.Exec(ctx, t.s.q.InsertInbox, consumer, id, t.s.d.Time(now))
			if err != nil {
				return nil, t.s.d.Classify(err)
			}
			inserted[id] = n == 1
		}
		return inserted, nil
	}
	query, args := t.s.InsertInboxes(consumer, messageIDs, now)
	rows, err := t.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, t.s.d.Classify(err)
	}
	inserted, err := InsertedInboxes(rows)
	return inserted, t.s.d.Classify(err)
}

// InsertInboxes is the statement that inserts a batch's inbox rows in one go, in sorted order,
// and returns the ids it inserted (read them with InsertedInboxes); "" when the dialect has none.
func (s *Store) InsertInboxes(consumer string, messageIDs []string, now time.Time) (query string, args []any) {
	if s.q.InsertInboxes == "" {
		return "", nil
	}
	ids := slices.Compact(slices.Sorted(slices.Values(messageIDs)))
	return s.q.InsertInboxes, []any{consumer, s.d.Strings(ids), s.d.Time(now)}
}

// InsertedInboxes reads the ids the statement of InsertInboxes returned, and closes rows.
func InsertedInboxes(rows dbexec.Rows) (map[string]bool, error) {
	defer rows.Close()
	inserted := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		inserted[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return inserted, rows.Close()
}

// InboxTx is an inbox transaction over tx, begun by the caller (store/pgxstore begins it in one
// round trip with its inbox rows).
func (s *Store) InboxTx(tx dbexec.Tx) store.InboxTx { return inboxTx{userTx{s: s, tx: tx}} }

func (t inboxTx) LockVersion(ctx context.Context, consumer, key string) (int64, bool, error) {
	if _, err := t.tx.Exec(ctx, t.s.q.VersionPlaceholder, consumer, key, t.s.d.Time(time.Now())); err != nil {
		return 0, false, t.s.d.Classify(err)
	}
	var v int64
	found, err := dbexec.FirstOf(ctx, t.tx, t.s.q.LockVersion, []any{consumer, key}, &v)
	return v, found && v > 0, t.s.d.Classify(err) // version 0 is the placeholder of a key never applied
}

func (t inboxTx) ParkMessage(ctx context.Context, p store.Parked) error {
	_, err := t.tx.Exec(ctx, t.s.q.ParkMessage, p.Consumer, p.Key, p.Version, p.MessageID, p.Topic, p.Payload, string(p.Metadata),
		t.s.d.Time(p.ParkedAt))
	return t.s.d.Classify(err)
}

func (t inboxTx) TakeParked(ctx context.Context, consumer, key string, version int64) (store.Parked, bool, error) {
	p := store.Parked{Consumer: consumer, Key: key, Version: version}
	var metadata string
	var parkedAt any
	found, err := dbexec.FirstOf(ctx, t.tx, t.s.q.TakeParked, []any{consumer, key, version},
		&p.MessageID, &p.Topic, &p.Payload, &metadata, &parkedAt)
	if err != nil || !found {
		return p, false, t.s.d.Classify(err)
	}
	p.Metadata = []byte(metadata)
	if p.Payload == nil {
		p.Payload = []byte{}
	}
	if t.s.q.DeleteParked != "" {
		if _, err := t.tx.Exec(ctx, t.s.q.DeleteParked, consumer, key, version); err != nil {
			return p, false, t.s.d.Classify(err)
		}
	}
	return p, true, nil
}

func (t inboxTx) DeadLetterParked(ctx context.Context, q store.InboxDeadLetter) error {
	payload := q.Payload
	if payload == nil {
		payload = []byte{}
	}
	f := FactsOf(q.Metadata, q.Reason)
	if _, err := t.tx.Exec(ctx, t.s.q.DeadLetter, q.Consumer, q.Topic, q.MessageID, payload, string(q.Metadata), q.Reason,
		q.Deliveries, t.s.d.Time(q.Now), f.PartitionKey, f.EventType, f.FailureGroup, f.SourceSeq); err != nil {
		return fmt.Errorf("dead-letter parked message %s: %w", q.MessageID, t.s.d.Classify(err))
	}
	_, err := t.tx.Exec(ctx, t.s.q.ForgetInbox, q.Consumer, q.MessageID)
	return t.s.d.Classify(err)
}

// savepoint is the one the order guard sets before it applies a parked message.
const savepoint = "outboxkit_parked"

func (t inboxTx) Savepoint(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, "SAVEPOINT "+savepoint)
	return t.s.d.Classify(err)
}

func (t inboxTx) RollbackToSavepoint(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint)
	return t.s.d.Classify(err)
}

func (t inboxTx) StoreVersion(ctx context.Context, consumer, key string, version int64, now time.Time) error {
	_, err := t.tx.Exec(ctx, t.s.q.StoreVersion, consumer, key, version, t.s.d.Time(now))
	return t.s.d.Classify(err)
}
