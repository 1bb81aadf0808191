package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// detailColumns are listColumns, then the metadata and the payload's first ?1 bytes.
func detailColumns(t letterTable) string {
	return t.listColumns("l") + ", l.metadata, substr(l.payload, 1, ?1)"
}

func (s *Store) readDetail(ctx context.Context, t letterTable, cond string, args []any) (store.DeadLetter, error) {
	stmt := fmt.Sprintf("SELECT %s, coalesce(%s, '') FROM %s AS l WHERE %s", detailColumns(t), "l."+t.reason, t.table, cond)
	if !t.outbox {
		stmt = fmt.Sprintf("SELECT %s, l.reason FROM %s AS l WHERE %s", detailColumns(t), t.table, cond)
	}
	var l store.DeadLetter
	err := scanDetail(s.db.QueryRow(ctx, s.d.Console().render(stmt+" LIMIT 1"), args...), &l)
	if errors.Is(err, dbexec.ErrNoRows) {
		return l, store.ErrNoLetter
	}
	if err != nil {
		return l, s.d.Classify(err)
	}
	return l, nil
}

// scanDetail reads into l a row of detailColumns, then the letter's whole error, then extra.
func scanDetail(row dbexec.Row, l *store.DeadLetter, extra ...any) error {
	ls := letterScan{l: l}
	var metadata []byte
	dest := append(ls.dest(), &metadata, &l.Payload, &l.Reason)
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return err
	}
	ls.done()
	l.Metadata = decodeMetadata(metadata)
	if l.Payload == nil {
		l.Payload = []byte{}
	}
	return nil
}

func (s *Store) DeadLetter(ctx context.Context, side string, id int64, payloadMax int) (store.DeadLetter, error) {
	outbox, consumers := s.d.Console().tables()
	var (
		l   store.DeadLetter
		err error
	)
	if side == store.SideOutbox {
		// Dead-lettered, or archived: through the partial index on dead rows' seq.
		l, err = s.readDetail(ctx, outbox, "l.seq = ?2 AND l.dead_lettered_at IS NOT NULL AND l.published_at IS NULL", []any{payloadMax, id})
	} else {
		l, err = s.readDetail(ctx, consumers, "l.id = ?2 AND l.consumer = ?3", []any{payloadMax, id, side})
	}
	if err != nil && !errors.Is(err, store.ErrNoLetter) {
		err = fmt.Errorf("read dead letter %s #%d: %w", side, id, err)
	}
	return l, err
}

func (s *Store) DeadLetterPayload(ctx context.Context, side string, id int64) ([]byte, error) {
	l, err := s.DeadLetter(ctx, side, id, math.MaxInt32)
	return l.Payload, err
}
