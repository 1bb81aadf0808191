package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
)

// OrderGuardConfig configures NewOrderGuard.
type OrderGuardConfig struct {
	// Pool reaches the database holding inbox_versions. Required.
	Pool *pgxpool.Pool
	// Schema holds outboxkit's tables. Default "outboxkit".
	Schema string
	// Consumer names the consuming service. Required.
	Consumer string
	// FirstVersion is the version expected for a key this consumer has never seen. Default 1.
	// Set 0 to accept whatever version comes first, for a consumer that joins a running stream.
	FirstVersion *int64
	// ParkDelay is how long a message that arrived ahead of its turn waits before it is nacked,
	// so that it does not spin while the earlier one is on its way. Default 200ms.
	ParkDelay time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// ErrAhead is returned (wrapped) for a message whose version is ahead of the next one expected for
// its key: an earlier event has not been applied yet.
var ErrAhead = errors.New("arrived ahead of its turn")

// parked marks an error that in-process retries cannot fix: only redelivery, after the earlier
// message, can.
type parked struct{ err error }

func (p *parked) Error() string { return p.err.Error() }
func (p *parked) Unwrap() error { return p.err }

// NewOrderGuard applies each key's events in version order, for consumers whose broker does not
// keep per-key order (or that replay). It goes inside the inbox, next to the handler, and reads
// the version set with outboxkit.SetVersion; messages without a version or a partition key pass
// through unguarded.
//
// For the next expected version the handler runs and the version is stored in the same
// transaction as the effect. A stale version (already applied) is acknowledged without running the
// handler. A version ahead of the next expected one is parked: after ParkDelay it is nacked, to be
// delivered again, until the dead-letter middleware quarantines it after MaxDeliveries with the
// versions in the reason.
func NewOrderGuard(cfg OrderGuardConfig) (message.HandlerMiddleware, error) {
	b, err := newBase(cfg.Pool, cfg.Schema, cfg.Consumer)
	if err != nil {
		return nil, fmt.Errorf("order guard config: %w", err)
	}
	first := int64(1)
	if cfg.FirstVersion != nil {
		first = *cfg.FirstVersion
	}
	if first < 0 {
		return nil, fmt.Errorf("order guard config: field FirstVersion must not be negative, got %d", first)
	}
	if cfg.ParkDelay == 0 {
		cfg.ParkDelay = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	lock := b.schema.Render(querySQL("version_lock.sql"))
	store := b.schema.Render(querySQL("version_store.sql"))

	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			key := outboxkit.PartitionKey(msg)
			version, ok := outboxkit.Version(msg)
			if key == "" || !ok {
				return h(msg)
			}
			ctx := msg.Context()
			tx, ok := handlers.TxFrom(ctx)
			if !ok {
				return nil, handlers.Permanent(errors.New("order guard: no inbox transaction; put it inside the inbox middleware"))
			}
			var applied int64
			switch err := tx.QueryRow(ctx, lock, b.consumer, key).Scan(&applied); {
			case errors.Is(err, pgx.ErrNoRows):
				applied = -1 // never seen
			case err != nil:
				return nil, fmt.Errorf("order guard: read version of key %s: %w", key, err)
			}
			expected := applied + 1
			if applied < 0 {
				expected = first
			}
			switch {
			case applied >= 0 && version <= applied:
				deliveryOf(msg).duplicate = true // stale: applied already, acknowledged unprocessed
				return nil, nil
			case expected > 0 && version > expected:
				timer := time.NewTimer(cfg.ParkDelay)
				select {
				case <-ctx.Done():
				case <-timer.C:
				}
				timer.Stop()
				return nil, &parked{fmt.Errorf("key %s: version %d %w, version %d not applied yet", key, version, ErrAhead, expected)}
			}
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			if _, err := tx.Exec(ctx, store, b.consumer, key, version, cfg.Now()); err != nil {
				return nil, fmt.Errorf("order guard: store version %d of key %s: %w", version, key, err)
			}
			return out, nil
		}
	}, nil
}
