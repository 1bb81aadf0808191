package forwarder

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// row is one claimed outbox row, locked by the pass's transaction.
type row struct {
	seq       int64
	uuid      string
	topic     string
	key       *string
	payload   []byte
	metadata  string // JSON object of strings, as stored
	createdAt time.Time
	attempts  int
}

// claim locks the next rows to publish (see sql/claim.sql) and returns them grouped by partition
// key: each group is one key's rows in seq order, a row without a key is a group of its own, and
// groups are ordered by their first row. At most limit rows are returned.
func (f *Forwarder) claim(ctx context.Context, tx pgx.Tx, now time.Time, limit int) ([][]row, error) {
	rows, err := tx.Query(ctx, f.q.claim, now, limit, f.cfg.ParkKeyOnDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.seq, &x.uuid, &x.topic, &x.key, &x.payload, &x.metadata, &x.createdAt, &x.attempts)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	byKey := map[string]int{}
	var groups [][]row
	for _, r := range claimed {
		if r.key == nil {
			groups = append(groups, []row{r})
			continue
		}
		if i, ok := byKey[*r.key]; ok {
			groups[i] = append(groups[i], r)
			continue
		}
		byKey[*r.key] = len(groups)
		groups = append(groups, []row{r})
	}
	return groups, nil
}
