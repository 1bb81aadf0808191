package pglog

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// backfill publishes the outbox rows left in the table — the events the relay may not have
// published — before the log is followed: with snapshot, as the table stood when the slot was
// made (the log carries every later commit); without, as it stands (a later commit may then be
// published twice). It ends with the slot's position, which confirms the backfill.
func (s *session) backfill(ctx context.Context, snapshot string, at pglogrepl.LSN) error {
	r := s.r
	tx, err := r.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("backfill: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if snapshot != "" {
		if _, err := tx.Exec(ctx, r.sql.SetSnapshot(snapshot)); err != nil {
			return fmt.Errorf("backfill: take the slot's snapshot: %w", err)
		}
	}
	nextStatus := time.Now().Add(time.Hour) // not streaming yet: no status to send
	var after int64
	n := 0
	for {
		rows, err := tx.Query(ctx, r.sql.Backfill, after, backfillBatch)
		if err != nil {
			return fmt.Errorf("backfill: read the outbox: %w", err)
		}
		var batch []item
		for rows.Next() {
			it, err := scanRow(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("backfill: read the outbox: %w", err)
			}
			batch = append(batch, it)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("backfill: read the outbox: %w", err)
		}
		for _, it := range batch {
			if err := s.send(ctx, it, &nextStatus); err != nil {
				return err
			}
		}
		n += len(batch)
		if len(batch) < backfillBatch {
			break
		}
		after = batch[len(batch)-1].row.Seq
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("backfill: end the snapshot: %w", err)
	}
	if at == 0 {
		at = 1 // a backfill without a known position still has to record its end
	}
	if err := s.send(ctx, item{end: at}, &nextStatus); err != nil {
		return err
	}
	r.log.Info("Backfill read the outbox rows left in the table", r.fields.Add(watermill.LogFields{"rows": n}))
	return nil
}

// backfillBatch is how many rows of the table a backfill reads at a time.
const backfillBatch = 1000

// scanRow reads one outbox row selected with the columns of the statements that read events back
// (internal/pgsql's event_columns.sql) into an item, as the log would carry it.
func scanRow(rows pgx.Rows) (item, error) {
	var (
		it       item
		uuidText *string
		metadata string
	)
	if err := rows.Scan(&it.delKey, &uuidText, &it.row.Seq, &it.row.Topic, &it.row.PartitionKey, &it.row.Payload, &metadata, &it.row.CreatedAt); err != nil {
		return item{}, err
	}
	it.row.Metadata = []byte(metadata)
	it.row.UUID = it.delKey
	if uuidText != nil {
		it.row.UUID = *uuidText
	}
	return it, nil
}
