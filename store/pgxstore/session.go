package pgxstore

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/dbexec/pgxexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

// Session is the consumer operations; the batch consumer's transactions begin in one round trip
// with their inbox rows (store.InboxBeginner).
func (s *Store) Session() store.Session { return session{Session: s.Store.Session(), s: s} }

type session struct {
	store.Session
	s *Store
}

var _ store.InboxBeginner = session{}

// BeginInboxes sends BEGIN and the batch's inbox INSERT in one pipeline (see pgxexec.BeginWith):
// one round trip where BeginInbox and InsertInboxes take two. The transaction the handlers get is
// a pgx.Tx as any other.
func (se session) BeginInboxes(ctx context.Context, consumer string, messageIDs []string, now time.Time) (store.InboxTx, map[string]bool, error) {
	query, args := se.s.InsertInboxes(consumer, messageIDs, now)
	var inserted map[string]bool
	tx, err := pgxexec.BeginWith(ctx, se.s.pool, query, args, func(rows dbexec.Rows) (err error) {
		inserted, err = sqlstore.InsertedInboxes(rows)
		return err
	})
	if err != nil {
		return nil, nil, se.s.d.Classify(err)
	}
	return se.s.InboxTx(tx), inserted, nil
}
