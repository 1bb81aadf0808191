package forwarder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/schema"
)

// Outbox is the outbox table as operators see it: its backlog, its dead letters, its retention.
// It needs no broker, so tools (outboxctl) and health checks can use it beside or without a relay.
// Its methods are safe for concurrent use.
type Outbox struct {
	pool *pgxpool.Pool
	q    queries
	now  func() time.Time
}

// OutboxConfig configures NewOutbox.
type OutboxConfig struct {
	// Schema holds the outbox table. Default "outboxkit".
	Schema string
	// Now is the clock for ages and retention. Default time.Now.
	Now func() time.Time
}

// NewOutbox returns a handle on the outbox in cfg.Schema. It does not touch the database.
func NewOutbox(pool *pgxpool.Pool, cfg OutboxConfig) (*Outbox, error) {
	if pool == nil {
		return nil, errors.New("outbox: pool is nil: pass the *pgxpool.Pool of the database holding the outbox")
	}
	name, err := schema.Parse(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Outbox{pool: pool, q: loadQueries(name), now: cfg.Now}, nil
}

// Stats describes the outbox's backlog.
type Stats struct {
	Pending            int           // rows waiting to be published (including rows backing off)
	OldestPendingAge   time.Duration // age of the oldest pending row; 0 when none
	DeadLettered       int           // rows parked after MaxAttempts, waiting for an operator
	OldestDeadLettered time.Duration // time since the oldest dead letter was parked; 0 when none
}

// Stats reads the backlog in one query over the index of unpublished rows.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var (
		s                      Stats
		oldestPending, oldDead pgtype.Timestamptz
	)
	err := o.pool.QueryRow(ctx, o.q.stats).Scan(&s.Pending, &oldestPending, &s.DeadLettered, &oldDead)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	now := o.now()
	if oldestPending.Valid {
		s.OldestPendingAge = max(0, now.Sub(oldestPending.Time))
	}
	if oldDead.Valid {
		s.OldestDeadLettered = max(0, now.Sub(oldDead.Time))
	}
	return s, nil
}

// DeadLetterFilter selects dead-lettered rows. Set fields narrow the selection (they combine with
// AND); an empty filter selects nothing for a replay unless All is set, so that a forgotten flag
// never replays everything.
type DeadLetterFilter struct {
	Seqs          []int64
	UUIDs         []string
	Topic         string
	PartitionKey  string
	ErrorContains string
	From, Until   time.Time // dead-lettered at or after From, before Until
	// Limit bounds a listing. Default 100. Replays are not limited.
	Limit int
	All   bool
}

func (d DeadLetterFilter) empty() bool {
	return len(d.Seqs) == 0 && len(d.UUIDs) == 0 && d.Topic == "" && d.PartitionKey == "" &&
		d.ErrorContains == "" && d.From.IsZero() && d.Until.IsZero()
}

func (d DeadLetterFilter) args() []any {
	seqs, uuids := d.Seqs, d.UUIDs
	if seqs == nil {
		seqs = []int64{}
	}
	if uuids == nil {
		uuids = []string{}
	}
	ts := func(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }
	return []any{seqs, uuids, d.Topic, d.PartitionKey, d.ErrorContains, ts(d.From), ts(d.Until)}
}

// DeadLetter is a dead-lettered outbox row.
type DeadLetter struct {
	Seq            int64
	UUID           string
	Topic          string
	PartitionKey   string
	Payload        []byte
	Metadata       map[string]string // nil when the stored metadata is not an object of strings
	Attempts       int
	LastError      string
	CreatedAt      time.Time
	DeadLetteredAt time.Time
}

// DeadLetters lists the selected dead-lettered rows, oldest first.
func (o *Outbox) DeadLetters(ctx context.Context, filter DeadLetterFilter) ([]DeadLetter, error) {
	if filter.Limit == 0 {
		filter.Limit = 100
	}
	rows, err := o.pool.Query(ctx, o.q.deadLetters, append(filter.args(), filter.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list outbox dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var metadata string
		err := r.Scan(&d.Seq, &d.UUID, &d.Topic, &d.PartitionKey, &d.Payload, &metadata, &d.Attempts,
			&d.LastError, &d.CreatedAt, &d.DeadLetteredAt)
		if err == nil && json.Unmarshal([]byte(metadata), &d.Metadata) != nil {
			d.Metadata = nil // the reason it was dead-lettered, likely; LastError says so
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list outbox dead letters: %w", err)
	}
	return out, nil
}

// ReplayDeadLetters puts the selected dead-lettered rows back in line with a fresh attempt budget
// and returns their seqs. They keep their UUIDs, so a consumer that already processed one (before
// a lost mark, say) absorbs the replay in its inbox. Replayed rows keep their place in their key's
// order.
func (o *Outbox) ReplayDeadLetters(ctx context.Context, filter DeadLetterFilter) ([]int64, error) {
	if filter.empty() && !filter.All {
		return nil, errors.New("replay dead letters: the filter is empty; name seqs, UUIDs, a topic, a key, " +
			"an error text or a time range, or set All")
	}
	rows, err := o.pool.Query(ctx, o.q.replay, filter.args()...)
	if err != nil {
		return nil, fmt.Errorf("replay dead letters: %w", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("replay dead letters: %w", err)
	}
	return seqs, nil
}

// PrunePublished deletes rows published more than olderThan ago, batchSize rows per statement
// (each its own short transaction), until none is left, and returns the number deleted.
func (o *Outbox) PrunePublished(ctx context.Context, olderThan time.Duration, batchSize int) (int, error) {
	if olderThan <= 0 || batchSize < 1 {
		return 0, fmt.Errorf("prune published outbox rows: olderThan (%s) and batchSize (%d) must be positive", olderThan, batchSize)
	}
	cutoff := o.now().Add(-olderThan)
	total := 0
	for {
		tag, err := o.pool.Exec(ctx, o.q.prunePublished, cutoff, batchSize)
		if err != nil {
			return total, fmt.Errorf("prune published outbox rows: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < batchSize {
			return total, nil
		}
	}
}
