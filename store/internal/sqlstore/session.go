package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

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
	if err := se.s.insertDeadLetter(ctx, se.db, q); err != nil {
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
