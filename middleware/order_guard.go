package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/dbtext"
	"github.com/outboxkit/outboxkit/store"
)

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
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c OrderGuardConfig) withDefaults() OrderGuardConfig {
	if c.FirstVersion == 0 && !c.AnyFirstVersion {
		c.FirstVersion = 1
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
	return errors.Join(errs...)
}

// NewOrderGuard applies each key's events in version order, for consumers whose broker does not
// keep per-key order through redeliveries, or that replay. It goes inside the inbox, next to the
// handler, and reads the version set with outboxkit.SetVersion; messages without a version or a
// partition key pass through unguarded.
//
// For the next expected version the handler runs and the version is stored in the same
// transaction as the effect. A stale version (already applied) is acknowledged without running the
// handler. A version ahead of the next expected one is parked: kept in the inbox_parked table, in
// the inbox's transaction, and acknowledged — it never waits in the broker, where a broker that
// redelivers in place (Kafka, Redis Streams) would block everything behind it, nor counts toward
// MaxDeliveries. The transaction that applies its predecessor then applies it too, and whatever
// was parked after it, in version order. A parked message that fails for good when its turn comes
// (a permanent error) is dead-lettered, and its predecessor still commits; any other failure rolls
// the whole transaction back, and the predecessor's delivery is retried.
//
// A parked message waits for as long as its predecessor takes: a predecessor in the dead letters
// holds its key's later versions until it is replayed. See inbox_parked for what waits.
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
	case expected > 0 && version > expected:
		return nil, g.park(ctx, d, msg, key, version)
	}
	out, err := h(msg)
	if err != nil {
		return out, err
	}
	if err := d.inbox.StoreVersion(ctx, g.cfg.Consumer, key, version, g.cfg.Now()); err != nil {
		return nil, fmt.Errorf("order guard: store version %d of key %s: %w", version, key, err)
	}
	more, err := g.applyParked(h, msg, d, key, version)
	if err != nil {
		return nil, err
	}
	return append(out, more...), nil
}

// park keeps msg until its predecessor is applied.
func (g *orderGuard) park(ctx context.Context, d *delivery, msg *message.Message, key string, version int64) error {
	metadata, err := json.Marshal(msg.Metadata)
	if err != nil || msg.Metadata == nil {
		metadata = []byte("{}")
	}
	payload := msg.Payload
	if payload == nil {
		payload = []byte{}
	}
	if err := d.inbox.ParkMessage(ctx, store.Parked{Consumer: g.cfg.Consumer, Key: key, Version: version, MessageID: msg.UUID,
		Topic: subscribeTopic(ctx), Payload: payload, Metadata: metadata, ParkedAt: g.cfg.Now()}); err != nil {
		return fmt.Errorf("order guard: park version %d of key %s: %w", version, key, err)
	}
	d.parked = true
	return nil
}

// applyParked applies, in the transaction that applied version of key, the versions parked after
// it, in order, for as long as the next one is there.
func (g *orderGuard) applyParked(h message.HandlerFunc, msg *message.Message, d *delivery, key string, version int64) ([]*message.Message, error) {
	ctx := msg.Context()
	var out []*message.Message
	for next := version + 1; ; next++ {
		p, found, err := d.inbox.TakeParked(ctx, g.cfg.Consumer, key, next)
		if err != nil {
			return nil, fmt.Errorf("order guard: take parked version %d of key %s: %w", next, key, err)
		}
		if !found {
			return out, nil
		}
		pm := message.NewMessage(p.MessageID, p.Payload)
		if err := json.Unmarshal(p.Metadata, &pm.Metadata); err != nil || pm.Metadata == nil {
			pm.Metadata = message.Metadata{}
		}
		// Its own delivery record: OutboundKey and the handler's view name it, not its predecessor.
		pd := &delivery{count: 1, locked: d.locked, inbox: d.inbox, consumer: d.consumer, message: p.MessageID}
		pm.SetContext(context.WithValue(ctx, deliveryKey{}, pd))
		if err := d.inbox.Savepoint(ctx); err != nil {
			return nil, fmt.Errorf("order guard: %w", err)
		}
		res, herr := h(pm)
		switch {
		case herr == nil:
			if err := d.inbox.StoreVersion(ctx, g.cfg.Consumer, key, next, g.cfg.Now()); err != nil {
				return nil, fmt.Errorf("order guard: store version %d of key %s: %w", next, key, err)
			}
			out = append(out, res...)
		case handlers.IsPermanent(herr):
			// Its partial work is undone; it goes to the dead letters, and what came before it
			// commits. The versions after it stay parked until it is replayed.
			if err := d.inbox.RollbackToSavepoint(ctx); err != nil {
				return nil, fmt.Errorf("order guard: %w", err)
			}
			if err := d.inbox.DeadLetterParked(ctx, store.InboxDeadLetter{Consumer: g.cfg.Consumer, Topic: p.Topic, MessageID: p.MessageID,
				Payload: p.Payload, Metadata: p.Metadata, Deliveries: 1, Now: g.cfg.Now(),
				Reason: dbtext.Storable(fmt.Sprintf("parked version %d of key %s failed when its turn came: %v", next, key, herr)),
			}); err != nil {
				return nil, fmt.Errorf("order guard: %w", err)
			}
			return out, nil
		default:
			return nil, fmt.Errorf("order guard: parked version %d of key %s (message %s) failed when its turn came: %w",
				next, key, p.MessageID, herr)
		}
	}
}
