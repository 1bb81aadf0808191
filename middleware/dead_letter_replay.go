package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/schema"
)

// DeadLetter is a quarantined message, as received.
type DeadLetter struct {
	ID             int64
	Consumer       string
	Topic          string
	MessageID      string
	Payload        []byte
	Metadata       message.Metadata
	Reason         string
	Deliveries     int
	DeadLetteredAt time.Time
}

// DeadLetterFilter selects dead letters still waiting for a replay. Set fields narrow the
// selection (they combine with AND).
type DeadLetterFilter struct {
	Consumer       string
	IDs            []int64
	MessageIDs     []string
	Topic          string
	ReasonContains string
	From, Until    time.Time // dead-lettered at or after From, before Until
	// Limit bounds the result. Default 100.
	Limit int
	// IncludeReplayed also selects dead letters already replayed, to replay them again.
	IncludeReplayed bool
	// All must be set to select with an otherwise empty filter, so that a forgotten flag never
	// replays everything.
	All bool
}

func (f DeadLetterFilter) empty() bool {
	return f.Consumer == "" && len(f.IDs) == 0 && len(f.MessageIDs) == 0 && f.Topic == "" &&
		f.ReasonContains == "" && f.From.IsZero() && f.Until.IsZero()
}

// ListDeadLetters returns the dead letters matching filter, oldest first.
func ListDeadLetters(ctx context.Context, pool *pgxpool.Pool, schemaName string, filter DeadLetterFilter) ([]DeadLetter, error) {
	name, err := schema.Parse(schemaName)
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("list dead letters: pool is nil")
	}
	if filter.Limit == 0 {
		filter.Limit = 100
	}
	ids, msgIDs := filter.IDs, filter.MessageIDs
	if ids == nil {
		ids = []int64{}
	}
	if msgIDs == nil {
		msgIDs = []string{}
	}
	ts := func(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }
	rows, err := pool.Query(ctx, name.Render(querySQL("dead_letters.sql")), filter.Consumer, ids, msgIDs,
		filter.Topic, filter.ReasonContains, ts(filter.From), ts(filter.Until), filter.Limit, filter.IncludeReplayed)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var metadata string
		err := r.Scan(&d.ID, &d.Consumer, &d.Topic, &d.MessageID, &d.Payload, &metadata, &d.Reason,
			&d.Deliveries, &d.DeadLetteredAt)
		if err == nil {
			d.Metadata = message.Metadata{}
			err = json.Unmarshal([]byte(metadata), &d.Metadata)
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// ReplayConfig configures ReplayDeadLetters.
type ReplayConfig struct {
	// Pool reaches the database holding dead_letters. Required.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Publisher sends the messages back to their topics, typically the broker publisher the
	// forwarder uses. Required.
	Publisher message.Publisher
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// ReplayDeadLetters re-publishes the selected dead letters to the topics they came from, with their
// UUIDs, payloads and metadata unchanged but for a replay token (outboxkit.MetadataReplay, which
// keeps brokers that deduplicate publishes from dropping the replay), and returns them. Each one's delivery count is reset
// first, so that it gets its full MaxDeliveries again. A consumer that processed the message
// meanwhile (or another consumer of the topic that already had it) absorbs the replay in its
// inbox as a duplicate. Replay stops at the first message that cannot be published; those already
// sent are marked replayed.
func ReplayDeadLetters(ctx context.Context, cfg ReplayConfig, filter DeadLetterFilter) ([]DeadLetter, error) {
	if filter.empty() && !filter.All {
		return nil, errors.New("replay dead letters: the filter is empty; name a consumer, ids, message ids, a topic, " +
			"a reason or a time range, or set All")
	}
	if cfg.Publisher == nil {
		return nil, errors.New("replay dead letters: a Publisher is required to send the messages back")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	name, err := schema.Parse(cfg.Schema)
	if err != nil {
		return nil, err
	}
	letters, err := ListDeadLetters(ctx, cfg.Pool, cfg.Schema, filter)
	if err != nil {
		return nil, err
	}
	reset := name.Render(querySQL("reset_deliveries.sql"))
	mark := name.Render(querySQL("mark_replayed.sql"))
	for i, d := range letters {
		if _, err := cfg.Pool.Exec(ctx, reset, d.Consumer, d.MessageID); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d: reset its deliveries: %w", d.ID, err)
		}
		msg := message.NewMessage(d.MessageID, d.Payload)
		msg.Metadata = d.Metadata
		msg.Metadata.Set(outboxkit.MetadataReplay, fmt.Sprintf("%d.%d", d.ID, cfg.Now().UnixNano()))
		msg.SetContext(ctx)
		if err := cfg.Publisher.Publish(d.Topic, msg); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d (message %s) to %s: %w", d.ID, d.MessageID, d.Topic, err)
		}
		if _, err := cfg.Pool.Exec(ctx, mark, d.ID, cfg.Now()); err != nil {
			return letters[:i+1], fmt.Errorf("replay dead letter %d: published, but not marked replayed: %w", d.ID, err)
		}
	}
	return letters, nil
}
