package middleware

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/dbtext"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// ErrNoTenant is the reason a message naming no tenant (no outboxkit.MetadataTenant) is
// dead-lettered by a consumer serving many tenants: no tenant's database may take it.
var ErrNoTenant = errors.New("the message names no tenant (metadata " + outboxkit.MetadataTenant + "): " +
	"its producer must stamp it (a relay fleet does; outboxkit.SetTenant)")

// quarantine dead-letters, or first holds, the messages no tenant's database may take, in the
// service's own database (QuarantineStore) or to the dead-letter topic, behind a stack of its own:
//
//	[Tracing] → [Metrics] → Circuit → DeadLetter (or the dead-letter topic alone) → hold or refuse
type quarantine struct {
	cfg   TenantStackConfig
	stack []message.HandlerMiddleware

	mu    sync.Mutex
	held  map[string]*heldMessage // by tenant and message
	swept time.Time
}

// heldMessage is a message of an unknown tenant being held.
type heldMessage struct {
	firstSeen, lastSeen time.Time
	deliveries          int // in this process
}

func newQuarantine(cfg TenantStackConfig) (*quarantine, error) {
	if cfg.HoldBackoff == (outboxkit.Backoff{}) {
		cfg.HoldBackoff = DefaultHoldBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Default()
	}
	isUnreachable := cfg.IsUnreachable
	if isUnreachable == nil {
		isUnreachable = IsUnreachableIn(cfg.QuarantineStore)
	}
	var (
		stack []message.HandlerMiddleware
		errs  []error
	)
	add := func(m message.HandlerMiddleware, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		stack = append(stack, m)
	}
	if cfg.TracerProvider != nil {
		add(NewTracing(TracingConfig{Consumer: cfg.Consumer, TracerProvider: cfg.TracerProvider}))
	}
	if cfg.Metrics != nil {
		add(NewMetrics(MetricsConfig{Consumer: cfg.Consumer, Metrics: cfg.Metrics, Now: cfg.Now, Store: cfg.QuarantineStore}))
	}
	add(NewCircuit(CircuitConfig{Consumer: cfg.Consumer, Backoff: cfg.CircuitBackoff, IsUnreachable: isUnreachable,
		Metrics: cfg.Metrics, Now: cfg.Now, Logger: cfg.Logger}))
	if cfg.QuarantineStore != nil {
		add(NewDeadLetter(DeadLetterConfig{Store: cfg.QuarantineStore, Consumer: cfg.Consumer,
			DeadLetterPublisher: cfg.DeadLetterPublisher, DeadLetterTopic: cfg.DeadLetterTopic,
			IsUnreachable: isUnreachable, Now: cfg.Now, Logger: cfg.Logger}))
	} else {
		add(deadLetterTopicOnly(cfg))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("the quarantine of unknown tenants: %w", err)
	}
	return &quarantine{cfg: cfg, stack: stack, held: map[string]*heldMessage{}}, nil
}

// deadLetterTopicOnly sends a message the handler refused for good to the dead-letter topic and
// acknowledges it, when there is no QuarantineStore to keep it in: DeadLetter with its table
// disabled, which needs no store.
func deadLetterTopicOnly(cfg TenantStackConfig) (message.HandlerMiddleware, error) {
	poison, err := wmiddleware.PoisonQueueWithFilter(cfg.DeadLetterPublisher, cfg.DeadLetterTopic, func(err error) bool {
		var q *deadLettered
		return errors.As(err, &q)
	})
	if err != nil {
		return nil, err
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return poison(func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if !handlers.IsPermanent(err) {
				return out, err
			}
			reason := dbtext.Storable(err.Error())
			deliveryOf(msg).deadLettered = true
			logs.Warn(cfg.Logger, "Message dead-lettered: it waits for an operator's replay", nil, watermill.LogFields{
				"consumer": cfg.Consumer, "message_uuid": msg.UUID, "deliveries": 1, "reason": reason,
			})
			return nil, &deadLettered{reason: reason}
		})
	}, nil
}

// handle holds or dead-letters msg, whose tenant (none when "") no store serves: cause is what
// the tenant stores said.
func (q *quarantine) handle(msg *message.Message, tenant string, cause error) ([]*message.Message, error) {
	out, err := chain(q.stack, func(msg *message.Message) ([]*message.Message, error) {
		if tenant == "" {
			return nil, handlers.Permanent(ErrNoTenant)
		}
		return nil, q.unknown(msg, tenant, cause)
	})(msg)
	if err == nil && tenant != "" {
		// Dead-lettered. Not before: a dead letter that could not be kept is tried again on the
		// next delivery, its hold over, instead of the hold starting anew.
		q.served(msg, tenant)
	}
	return out, err
}

// unknown holds a message of an unknown tenant while its hold lasts (an error: the broker delivers
// it again), then refuses it for good (a permanent error: it is dead-lettered).
func (q *quarantine) unknown(msg *message.Message, tenant string, cause error) error {
	said := "" // what the tenant stores said, unless it is only that the tenant is unknown
	if cause != nil && cause.Error() != UnknownTenant(tenant).Error() && cause.Error() != ErrUnknownTenant.Error() {
		said = " (" + cause.Error() + ")"
	}
	if q.cfg.HoldUnknownFor <= 0 {
		return handlers.Permanent(fmt.Errorf("%w %q%s: no tenant's database takes its messages; "+
			"it was applied in none", ErrUnknownTenant, tenant, said))
	}
	now := q.cfg.Now()
	key := heldKey(msg, tenant)
	q.mu.Lock()
	q.sweep(now)
	m := q.held[key]
	if m == nil {
		m = &heldMessage{firstSeen: now}
		q.held[key] = m
	}
	m.deliveries++
	m.lastSeen = now
	firstSeen, deliveries := m.firstSeen, m.deliveries
	left := firstSeen.Add(q.cfg.HoldUnknownFor).Sub(now)
	q.mu.Unlock()
	if left <= 0 {
		return handlers.Permanent(fmt.Errorf("%w %q%s: no tenant's database takes its messages; held for %s "+
			"(HoldUnknownFor) since %s for the tenant to appear, in vain; it was applied in none",
			ErrUnknownTenant, tenant, said, q.cfg.HoldUnknownFor, firstSeen.Format(time.RFC3339)))
	}
	wait := min(q.cfg.HoldBackoff.Delay(deliveries), left)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-msg.Context().Done():
	case <-timer.C:
	}
	return fmt.Errorf("%w %q%s: the message is held until the tenant appears, at most until %s (HoldUnknownFor %s), "+
		"then dead-lettered", ErrUnknownTenant, tenant, said, firstSeen.Add(q.cfg.HoldUnknownFor).Format(time.RFC3339), q.cfg.HoldUnknownFor)
}

// served forgets the hold of a message whose tenant is served now, or that is dead-lettered.
func (q *quarantine) served(msg *message.Message, tenant string) {
	if q.cfg.HoldUnknownFor <= 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.held) > 0 {
		delete(q.held, heldKey(msg, tenant))
	}
}

// sweep forgets, at most once per HoldUnknownFor, the holds of messages not delivered for that
// long (handled by another process, say), so that the map does not grow. Under mu.
func (q *quarantine) sweep(now time.Time) {
	if now.Sub(q.swept) < q.cfg.HoldUnknownFor {
		return
	}
	q.swept = now
	for key, m := range q.held {
		if now.Sub(m.lastSeen) > q.cfg.HoldUnknownFor+q.cfg.HoldBackoff.Max {
			delete(q.held, key)
		}
	}
}

// heldKey names a held message: its tenant and its id (for a message without one, the digest its
// dead letter would be kept under).
func heldKey(msg *message.Message, tenant string) string {
	id := msg.UUID
	if id == "" {
		metadata, _ := json.Marshal(msg.Metadata)
		id = deadLetterID(msg, metadata)
	}
	return tenant + "\x00" + id
}
