package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// HeldClaim is a claim whose rows stay locked by the transaction that claimed them (FOR UPDATE
// SKIP LOCKED) until Finish marks them and commits, or Abandon rolls back. A process that dies
// holding it loses its session, and the database frees the rows.
type HeldClaim struct {
	tx   dbexec.Tx
	rows []store.OutboxRow
	d    Dialect
	q    *Queries
	done bool
}

// NewHeldClaim returns the claim of rows held by tx.
func NewHeldClaim(tx dbexec.Tx, rows []store.OutboxRow, d Dialect) *HeldClaim {
	return &HeldClaim{tx: tx, rows: rows, d: d, q: d.Queries()}
}

func (c *HeldClaim) Rows() []store.OutboxRow { return c.rows }

func (c *HeldClaim) Finish(ctx context.Context, o store.Outcome) error {
	if c.done {
		return errors.New("claim already finished")
	}
	c.done = true
	defer func() { _ = c.tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if err := Mark(ctx, c.tx, c.d, o, nil); err != nil {
		return err
	}
	if err := c.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit outbox pass: %w", c.d.Classify(err))
	}
	return nil
}

func (c *HeldClaim) Abandon(ctx context.Context) {
	c.done = true
	_ = c.tx.Rollback(context.WithoutCancel(ctx))
}

// Mark writes an outcome with the dialect's mark statements, each given extra (a lease owner,
// say) after its own parameters.
func Mark(ctx context.Context, q dbexec.Querier, d Dialect, o store.Outcome, extra []any) error {
	qs := d.Queries()
	if len(o.Published) > 0 {
		var err error
		if o.DeleteOnPublish {
			_, err = q.Exec(ctx, qs.DeletePublished, append([]any{d.Int64s(o.Published)}, extra...)...)
		} else {
			_, err = q.Exec(ctx, qs.MarkPublished, append([]any{d.Time(o.Now), d.Int64s(o.Published)}, extra...)...)
		}
		if err != nil {
			return fmt.Errorf("mark outbox rows published: %w", d.Classify(err))
		}
	}
	if len(o.Failed) == 0 {
		return nil
	}
	if err := d.MarkFailed(ctx, q, o.Failed, o.Now, extra); err != nil {
		return fmt.Errorf("record failed outbox publishes: %w", d.Classify(err))
	}
	if err := groupDeadRows(ctx, q, d, o.Failed); err != nil {
		return fmt.Errorf("file dead-lettered outbox rows under their failure group: %w", d.Classify(err))
	}
	return nil
}

// ScanOutboxRows reads claimed rows: seq, uuid, topic, partition key ("" for none), payload,
// metadata, created_at, attempts.
func ScanOutboxRows(rows dbexec.Rows) ([]store.OutboxRow, error) {
	defer rows.Close()
	var out []store.OutboxRow
	for rows.Next() {
		var (
			r       store.OutboxRow
			key     *string // NULL: no partition key
			created dbexec.Time
		)
		if err := rows.Scan(&r.Seq, &r.UUID, &r.Topic, &key, &r.Payload, &r.Metadata, &created, &r.Attempts); err != nil {
			return nil, err
		}
		if key != nil {
			r.PartitionKey = *key
		}
		r.CreatedAt = created.Time
		out = append(out, r)
	}
	return out, rows.Err()
}

// KeepBeforeGaps keeps, per partition key, the window's rows before the key's first pending row
// outside the window (gaps: key → that row's seq): a row must never overtake an earlier row of its
// key that another relay holds, that backs off, or (when parking) that is dead-lettered. Rows
// without a key are always kept. rows are in seq order; so is the result.
func KeepBeforeGaps(rows []store.OutboxRow, gaps map[string]int64) (kept, dropped []store.OutboxRow) {
	for _, r := range rows {
		if gap, ok := gaps[r.PartitionKey]; ok && r.PartitionKey != "" && r.Seq > gap {
			dropped = append(dropped, r)
			continue
		}
		kept = append(kept, r)
	}
	return kept, dropped
}

// QueryGaps runs a text-parameter dialect's claim_gaps statement (MySQL, SQLite) for the keys of
// window — arguments (keys, window seqs, park), the lists as dbexec.ListOf — and returns, per key,
// the seq of its first pending row outside the window. nil when no window row has a key.
func QueryGaps(ctx context.Context, q dbexec.Querier, query string, window []store.OutboxRow, park bool) (map[string]int64, error) {
	var keys []string
	seen := map[string]bool{}
	seqs := make([]int64, len(window))
	for i, r := range window {
		seqs[i] = r.Seq
		if r.PartitionKey != "" && !seen[r.PartitionKey] {
			seen[r.PartitionKey] = true
			keys = append(keys, r.PartitionKey)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, query, dbexec.ListOf(keys), dbexec.ListOf(seqs), park)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	gaps := map[string]int64{}
	for rows.Next() {
		var key string
		var seq int64
		if err := rows.Scan(&key, &seq); err != nil {
			return nil, err
		}
		gaps[key] = seq
	}
	return gaps, rows.Err()
}
