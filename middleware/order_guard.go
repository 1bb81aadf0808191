package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultParkDelay is how long a message that arrived ahead of its turn waits before it is nacked.
const DefaultParkDelay = 200 * time.Millisecond

// OrderGuardConfig configures NewOrderGuard.
type OrderGuardConfig struct {
	// Store holds inbox_versions. Required.
	Store store.Store
	// Consumer names the consuming service. Required.
	Consumer string
	// FirstVersion is the version expected for a key this consumer has never seen. Default 1.
	FirstVersion int64
	// AnyFirstVersion accepts whatever version comes first for a key never seen, for a consumer
	// that joins a running stream. Default false.
	AnyFirstVersion bool
	// ParkDelay is how long a message that arrived ahead of its turn waits before it is nacked,
	// so that it does not spin while the earlier one is on its way. Default DefaultParkDelay.
	ParkDelay time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c OrderGuardConfig) withDefaults() OrderGuardConfig {
	if c.FirstVersion == 0 && !c.AnyFirstVersion {
		c.FirstVersion = 1
	}
	if c.ParkDelay == 0 {
		c.ParkDelay = DefaultParkDelay
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c OrderGuardConfig) validate() error {
	errs := requireStoreAndConsumer(c.Store, c.Consumer)
	if c.FirstVersion < 0 {
		errs = append(errs, fmt.Errorf("field FirstVersion must not be negative, got %d", c.FirstVersion))
	}
	if c.AnyFirstVersion && c.FirstVersion > 0 {
		errs = append(errs, errors.New("fields FirstVersion and AnyFirstVersion contradict each other: choose one"))
	}
	if c.ParkDelay < 0 {
		errs = append(errs, fmt.Errorf("field ParkDelay must not be negative, got %s", c.ParkDelay))
	}
	return errors.Join(errs...)
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
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("order guard config: %w", err)
	}
	g := &orderGuard{cfg: cfg}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return g.handle(h, msg) }
	}, nil
}

type orderGuard struct{ cfg OrderGuardConfig }

func (g *orderGuard) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	key := outboxkit.PartitionKey(msg)
	version, ok := outboxkit.Version(msg)
	if key == "" || !ok {
		return h(msg)
	}
	ctx := msg.Context()
	d := deliveryOf(msg)
	if d.inbox == nil {
		return nil, handlers.Permanent(errors.New("order guard: no inbox transaction; put it inside the inbox middleware"))
	}
	applied, seen, err := d.inbox.LockVersion(ctx, g.cfg.Consumer, key)
	if err != nil {
		return nil, fmt.Errorf("order guard: read version of key %s: %w", key, err)
	}
	expected := applied + 1
	if !seen {
		expected = g.cfg.FirstVersion // 0 with AnyFirstVersion: whatever comes
	}
	switch {
	case seen && version <= applied:
		d.duplicate = true // stale: applied already, acknowledged unprocessed
		return nil, nil
	case expected > 0 && version > expected && d.batched:
		return nil, fmt.Errorf("key %s: version %d %w, version %d not applied yet", key, version, ErrAhead, expected)
	case expected > 0 && version > expected:
		timer := time.NewTimer(g.cfg.ParkDelay)
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
	if err := d.inbox.StoreVersion(ctx, g.cfg.Consumer, key, version, g.cfg.Now()); err != nil {
		return nil, fmt.Errorf("order guard: store version %d of key %s: %w", version, key, err)
	}
	return out, nil
}
