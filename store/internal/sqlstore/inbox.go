package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

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

func (s *Store) ResetDeliveries(ctx context.Context, consumer, messageID string) error {
	_, err := s.db.Exec(ctx, s.q.ResetDeliveries, consumer, messageID)
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
