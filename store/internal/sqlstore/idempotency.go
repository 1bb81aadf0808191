package sqlstore

import (
	"context"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

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

type idempotencyTx struct{ userTx }

func (t idempotencyTx) ClaimKey(ctx context.Context, scope, key string, hash []byte, now time.Time) (bool, error) {
	n, err := t.tx.Exec(ctx, t.s.q.ClaimKey, key, scope, hash, t.s.d.Time(now))
	return n == 1, t.s.d.Classify(err)
}

func (t idempotencyTx) RecordResponse(ctx context.Context, scope, key string, r store.IdempotencyRecord) error {
	_, err := t.tx.Exec(ctx, t.s.q.RecordResponse, scope, key, r.Status, string(r.Headers), r.Body)
	return t.s.d.Classify(err)
}
