package forwarder

import (
	"context"
	"fmt"
	"slices"
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

// claim locks the next rows to publish and returns them grouped by partition key: each group is
// one key's contiguous run of due rows in seq order (a row without a key is a group of its own),
// groups ordered by their first row. At most limit rows are returned.
func (f *Forwarder) claim(ctx context.Context, tx pgx.Tx, now time.Time, limit int) ([][]row, error) {
	rows, err := tx.Query(ctx, f.q.claim, now, limit, f.cfg.ParkKeyOnDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	type candidate struct {
		seq         int64
		key         *string
		head, ready bool
	}
	candidates, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := r.Scan(&c.seq, &c.key, &c.head, &c.ready)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	if len(candidates) == 0 {
		return nil, nil
	}

	// Keep, per key, the head and the followers up to the first one that is not ready: a row that
	// is backing off (or, when parking, dead-lettered) holds back everything behind it.
	slices.SortFunc(candidates, func(a, b candidate) int { return cmpInt64(a.seq, b.seq) })
	blocked := map[string]bool{}
	keyOf := make(map[int64]*string, len(candidates))
	chosen := make([]int64, 0, len(candidates))
	for _, c := range candidates {
		keyOf[c.seq] = c.key
		if c.key == nil {
			chosen = append(chosen, c.seq)
			continue
		}
		if blocked[*c.key] {
			continue
		}
		if !c.ready {
			blocked[*c.key] = true
			continue
		}
		chosen = append(chosen, c.seq)
	}
	// Cutting by seq keeps every key's run a prefix of itself.
	if len(chosen) > limit {
		chosen = chosen[:limit]
	}

	rows, err = tx.Query(ctx, f.q.fetch, chosen)
	if err != nil {
		return nil, fmt.Errorf("lock claimed outbox rows: %w", err)
	}
	fetched, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.seq, &x.uuid, &x.topic, &x.key, &x.payload, &x.metadata, &x.createdAt, &x.attempts)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("lock claimed outbox rows: %w", err)
	}

	// Group in seq order. A chosen row that changed between the claim and the lock (an operator
	// dead-lettered it, say) is missing here; the rest of its key waits for the next pass.
	byKey := map[string]int{}
	broken := map[string]bool{}
	var groups [][]row
	next := 0
	for _, seq := range chosen {
		var r *row
		if next < len(fetched) && fetched[next].seq == seq {
			r = &fetched[next]
			next++
		}
		switch {
		case r == nil:
			if k := keyOf[seq]; k != nil {
				broken[*k] = true
			}
		case r.key == nil:
			groups = append(groups, []row{*r})
		case broken[*r.key]:
		default:
			if i, ok := byKey[*r.key]; ok {
				groups[i] = append(groups[i], *r)
			} else {
				byKey[*r.key] = len(groups)
				groups = append(groups, []row{*r})
			}
		}
	}
	return groups, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
