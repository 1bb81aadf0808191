package mysqlbinlog

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// backfillPage is how many rows one read of the table takes.
const backfillPage = 1000

// readTable reads the rows waiting in the outbox when a relay group starts for the first time,
// or recovers from a checkpoint the server cannot send the log from (recoverFromTable), or
// starts again before that reading was published: the log it reads from holds no earlier rows
// for it. Pages are read in seq order, each in a short read-committed transaction
// with a locking read, which waits for writers whose commit is in the binary log but not yet
// visible: so every row committed before the position the group started from is in a page, or —
// committed after it — in the log. A row in both is published twice, never lost.
func (s *session) readTable(ctx context.Context) error {
	r := s.r
	var last int64
	total := 0
	for {
		page, err := s.readPage(ctx, last)
		if err != nil {
			return err
		}
		for _, it := range page {
			if err := s.send(ctx, it); err != nil {
				return err
			}
			last = it.row.Seq
		}
		total += len(page)
		if len(page) < backfillPage {
			break
		}
	}
	r.log.Info("Binlog relay read the rows waiting in the outbox", r.fields.Add(watermill.LogFields{"rows": total}))
	return nil
}

func (s *session) readPage(ctx context.Context, after int64) ([]item, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("read the rows waiting in the outbox: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	rows, err := tx.QueryContext(ctx, s.r.sql.backfill, after, backfillPage)
	if err != nil {
		return nil, fmt.Errorf("read the rows waiting in the outbox: %w", err)
	}
	defer rows.Close()
	var page []item
	for rows.Next() {
		it := item{fromTable: true}
		var (
			created string
			next    sql.NullString
		)
		if err := rows.Scan(&it.row.Seq, &it.row.UUID, &it.row.Topic, &it.row.PartitionKey, &it.row.Payload, &it.row.Metadata,
			&created, &it.row.Attempts, &next); err != nil {
			return nil, fmt.Errorf("read the rows waiting in the outbox: %w", err)
		}
		if it.row.CreatedAt, err = time.ParseInLocation(layout, created, time.UTC); err != nil {
			return nil, fmt.Errorf("read the rows waiting in the outbox: created_at %q: %w", created, err)
		}
		if next.Valid {
			if it.nextAt, err = time.ParseInLocation(layout, next.String, time.UTC); err != nil {
				return nil, fmt.Errorf("read the rows waiting in the outbox: next_attempt_at %q: %w", next.String, err)
			}
		}
		if it.row.Payload == nil {
			it.row.Payload = []byte{}
		}
		page = append(page, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the rows waiting in the outbox: %w", err)
	}
	rows.Close()
	// Commit releases the page's locks before its rows are published.
	return page, tx.Commit()
}
