package middleware

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultHoldBackoff spaces the deliveries of a message whose tenant is unknown while it is held
// (TenantStackConfig.HoldUnknownFor): 1s, 2s, 4s … capped at 30 seconds, each ±20%.
var DefaultHoldBackoff = outboxkit.Backoff{Initial: time.Second, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2}

// TenantStackConfig configures AddTenantConsumerHandler: one consumer serving many tenants, each
// message applied in its own tenant's database.
type TenantStackConfig struct {
	// StackConfig configures every tenant's stack, each built on its tenant's store under the one
	// Consumer name. Its Store is left nil: the stores come from Tenants. Its DeadLetterPublisher
	// and DeadLetterTopic also receive the dead letters of unknown tenants.
	//
	// Metrics count the deliveries of every tenant under Consumer; its gauge of waiting dead letters
	// reads QuarantineStore's (none without one), and the circuit state it shows is that of the
	// tenant whose circuit changed last.
	StackConfig

	// Tenants gives each tenant's store: NewTenantOpener (by URL), TenantStoreMap, or
	// TenantStoresFunc. Required.
	Tenants TenantStores

	// QuarantineStore keeps the dead letters of messages that no tenant's database can take — of
	// an unknown or disabled tenant, or naming no tenant — in its dead_letters table, under
	// Consumer: the service's own database, migrated. ReplayInboxDeadLetters on it sends them
	// again once their tenant is served. At least one of QuarantineStore and DeadLetterPublisher
	// is required, so that such messages are kept somewhere.
	QuarantineStore store.Store

	// HoldUnknownFor holds a message of an unknown tenant — one that may appear soon, as a tenant
	// being set up — for that long since this process first saw it, before dead-lettering it: each
	// delivery waits HoldBackoff and then fails, and the broker delivers it again. Once the tenant
	// is served the message is applied in its database as any other. The time is kept in the
	// process: a restart starts it anew, so a message may be held longer, never shorter. While a
	// delivery waits, a broker that hands the consumer one message at a time hands it no other.
	// A message naming no tenant is never held. Default 0: dead-lettered on its first delivery.
	HoldUnknownFor time.Duration
	// HoldBackoff spaces the deliveries of a held message, never beyond the end of its hold.
	// Default DefaultHoldBackoff.
	HoldBackoff outboxkit.Backoff
}

func (c TenantStackConfig) validate() error {
	var errs []error
	if c.Tenants == nil {
		errs = append(errs, errors.New("field Tenants is required: say where each tenant's store is "+
			"(NewTenantOpener, TenantStoreMap or TenantStoresFunc)"))
	}
	if c.Store != nil {
		errs = append(errs, errors.New("field Store is each tenant's, from Tenants: leave StackConfig.Store nil, and set "+
			"QuarantineStore to keep the dead letters of unknown tenants in the service's own database"))
	}
	if c.QuarantineStore == nil && c.DeadLetterPublisher == nil {
		errs = append(errs, errors.New("set QuarantineStore or DeadLetterPublisher so messages of unknown tenants are kept: "+
			"no tenant's database may take them"))
	}
	if c.HoldUnknownFor < 0 {
		errs = append(errs, fmt.Errorf("field HoldUnknownFor must not be negative, got %s", c.HoldUnknownFor))
	}
	if c.HoldBackoff != (outboxkit.Backoff{}) {
		errs = append(errs, c.HoldBackoff.Validate("HoldBackoff"))
	}
	return errors.Join(errs...)
}

// AddTenantConsumerHandler adds to r a handler that reads topic through sub for a consumer serving
// many tenants, and runs h behind a stack (see Stack) on the store of each message's tenant
// (outboxkit.Tenant: the MetadataTenant a relay fleet stamps): the message's inbox row, its
// delivery count, its dead letter and the effect h makes in the inbox's transaction
// (outboxkit.TxFrom) are all in that tenant's database. It checks, before anything runs, what
// AddConsumerHandler checks (cfg is valid, sub reads for cfg.Consumer), and that messages of
// unknown tenants have somewhere to be kept (cfg.QuarantineStore or cfg.DeadLetterPublisher).
//
// Each tenant's stack is built on its first message, on the store cfg.Tenants gives, and kept;
// it has the consumer's every part — its circuit, its delivery count, its inbox — so an outage of
// one tenant's database holds that tenant's messages only. A tenant whose store cannot be had (its
// database does not answer) holds its deliveries the same way, trying again with
// cfg.CircuitBackoff, and gives them back to the broker when the router stops.
//
// A message is never applied in another tenant's database than its own:
//
//   - a message naming no tenant is dead-lettered on its first delivery (ErrNoTenant);
//   - a message of a tenant cfg.Tenants does not serve (ErrUnknownTenant) is dead-lettered, with
//     a reason naming the tenant — held first for cfg.HoldUnknownFor if set.
//
// Their dead letters go to cfg.QuarantineStore's dead_letters table and, when set, to
// cfg.DeadLetterTopic (Watermill's reason_poisoned metadata says `unknown tenant "…"`); storing or
// sending one that fails leaves the message with the broker, held by a circuit while the
// quarantine cannot be reached. The handler is named handlerName in the router. On error nothing
// is added.
func AddTenantConsumerHandler(r *message.Router, handlerName, topic string, sub message.Subscriber, cfg TenantStackConfig,
	h message.NoPublishHandlerFunc) (*message.Handler, error) {
	if r == nil || sub == nil || h == nil {
		return nil, fmt.Errorf("add tenant consumer handler %q: a router, a subscriber and a handler are required", handlerName)
	}
	if topic == "" {
		return nil, fmt.Errorf("add tenant consumer handler %q: name the topic it reads", handlerName)
	}
	if err := checkSubscriber(sub, cfg.Consumer); err != nil {
		return nil, fmt.Errorf("add tenant consumer handler %q: %w", handlerName, err)
	}
	tc, err := newTenantConsumer(cfg, NoPublish(h))
	if err != nil {
		return nil, fmt.Errorf("add tenant consumer handler %q: %w", handlerName, err)
	}
	return r.AddConsumerHandler(handlerName, topic, sub, func(msg *message.Message) error {
		_, err := tc.handle(msg)
		return err
	}), nil
}

// tenantConsumer routes each message to its tenant's stack.
type tenantConsumer struct {
	cfg        TenantStackConfig
	h          message.HandlerFunc
	quarantine *quarantine

	mu      sync.Mutex
	tenants map[string]*tenantStack // tenants the TenantStores served, or failed to open
}

func newTenantConsumer(cfg TenantStackConfig, h message.HandlerFunc) (*tenantConsumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("consumer %q: %w", cfg.Consumer, err)
	}
	// Every tenant's stack is built from cfg: build one now, on a store that is never called, so a
	// mistake in cfg is said at start and not on each tenant's first message. Metrics and tracing
	// are left out of it (a Metrics would be attached to that store) and checked by the quarantine.
	check := cfg.StackConfig
	check.Store, check.Metrics, check.TracerProvider = uncalledStore{}, nil, nil
	if _, err := Stack(check); err != nil {
		return nil, err
	}
	q, err := newQuarantine(cfg)
	if err != nil {
		return nil, err
	}
	return &tenantConsumer{cfg: cfg, h: h, quarantine: q, tenants: map[string]*tenantStack{}}, nil
}

// uncalledStore stands for a tenant's store while cfg is checked: building a stack calls no store.
type uncalledStore struct{ store.Store }

func (tc *tenantConsumer) handle(msg *message.Message) ([]*message.Message, error) {
	tenant := outboxkit.Tenant(msg)
	if tenant == "" {
		return tc.quarantine.handle(msg, "", nil)
	}
	st, err := tc.cfg.Tenants.TenantStore(msg.Context(), tenant)
	if unknownTenant(st, err) {
		return tc.quarantine.handle(msg, tenant, err)
	}
	tc.quarantine.served(msg, tenant)
	out, err := tc.stack(tenant).handle(msg, st, err)
	var gone *tenantGone
	if errors.As(err, &gone) { // no longer served while its store could not be had
		return tc.quarantine.handle(msg, tenant, gone.err)
	}
	return out, err
}

// unknownTenant reports whether a TenantStores answer says that it serves no such tenant.
func unknownTenant(st store.Store, err error) bool {
	return errors.Is(err, ErrUnknownTenant) || (err == nil && st == nil)
}

// stack returns the tenant's stack, made on its first message.
func (tc *tenantConsumer) stack(tenant string) *tenantStack {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	ts := tc.tenants[tenant]
	if ts == nil {
		// A circuit of its own holds the tenant's deliveries while its store cannot be had; the
		// stack inside has another for the store's outages once it is had.
		circuit, _ := NewCircuit(CircuitConfig{Consumer: tc.cfg.Consumer, Backoff: tc.cfg.CircuitBackoff,
			IsUnreachable: isTenantStoreError, Now: tc.cfg.Now, Logger: tc.cfg.Logger}) // checked with the stack's
		ts = &tenantStack{tc: tc, tenant: tenant, circuit: circuit}
		tc.tenants[tenant] = ts
	}
	return ts
}

// tenantStack is one tenant's stack, on the store its TenantStores gave.
type tenantStack struct {
	tc      *tenantConsumer
	tenant  string
	circuit message.HandlerMiddleware

	mu      sync.Mutex
	store   store.Store
	handler message.HandlerFunc // the stack on store, around the consumer's handler
}

// handle runs the message behind the tenant's stack on st, or, while the tenant's store cannot be
// had (err), holds it and asks for the store again at each probe.
func (ts *tenantStack) handle(msg *message.Message, st store.Store, err error) ([]*message.Message, error) {
	first := true
	return ts.circuit(func(msg *message.Message) ([]*message.Message, error) {
		if !first {
			st, err = ts.tc.cfg.Tenants.TenantStore(msg.Context(), ts.tenant)
			if unknownTenant(st, err) {
				return nil, &tenantGone{err: err}
			}
		}
		first = false
		if err != nil {
			return nil, &tenantStoreError{tenant: ts.tenant, err: err}
		}
		h, err := ts.on(st)
		if err != nil {
			return nil, &tenantStoreError{tenant: ts.tenant, err: err}
		}
		return h(msg)
	})(msg)
}

// on returns the stack built on st, building it when the tenant's store is new or has changed.
func (ts *tenantStack) on(st store.Store) (message.HandlerFunc, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.handler != nil && sameStore(ts.store, st) {
		return ts.handler, nil
	}
	cfg := ts.tc.cfg.StackConfig
	cfg.Store = st
	stack, err := Stack(cfg)
	if err != nil {
		return nil, fmt.Errorf("build its stack: %w", err)
	}
	ts.store, ts.handler = st, chain(stack, ts.tc.h)
	return ts.handler, nil
}

// sameStore reports whether a and b are one store. A store of a type that cannot be compared is
// taken as the same: TenantStores gives one value per tenant (see TenantStores).
func sameStore(a, b store.Store) (same bool) {
	defer func() {
		if recover() != nil {
			same = true
		}
	}()
	return a == b
}

// tenantStoreError: the tenant's store could not be had; its circuit holds the delivery.
type tenantStoreError struct {
	tenant string
	err    error
}

func (e *tenantStoreError) Error() string {
	return fmt.Sprintf("tenant %q: its store cannot be had: %v", e.tenant, e.err)
}
func (e *tenantStoreError) Unwrap() error { return e.err }

func isTenantStoreError(err error) bool {
	var e *tenantStoreError
	return errors.As(err, &e)
}

// tenantGone: the tenant stopped being served while its delivery waited for its store.
type tenantGone struct{ err error }

func (e *tenantGone) Error() string { return "the tenant is no longer served" }
