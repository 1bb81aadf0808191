package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/outboxkit/outboxkit/store"
)

// ErrUnknownTenant is wrapped, with the tenant's name, by a TenantStores that serves no such
// tenant (unknown, or disabled): a message of that tenant is applied in no database. It is
// dead-lettered, or held for a while first (TenantStackConfig.HoldUnknownFor).
var ErrUnknownTenant = errors.New("unknown tenant")

// UnknownTenant returns the error a TenantStores gives for a tenant it does not serve: it wraps
// ErrUnknownTenant and names the tenant.
func UnknownTenant(tenant string) error { return fmt.Errorf("%w %q", ErrUnknownTenant, tenant) }

// TenantStores gives the store of each tenant a consumer serves (see AddTenantConsumerHandler).
//
// TenantStore is called on every delivery, from the handlers' goroutines at once: it must be safe
// for concurrent use, and cheap — cache what it opens, as NewTenantOpener does. It returns:
//
//   - the tenant's store, migrated (pipeline.Migrate), in which the message's inbox row and its
//     effect commit. It returns the same store value for a tenant on every call while the tenant's
//     database stays where it is: the consumer keeps one stack per tenant and builds it anew
//     when the store changes;
//   - an error wrapping ErrUnknownTenant (UnknownTenant(tenant)) for a tenant it does not serve, or
//     no longer serves. (nil, nil) says the same;
//   - any other error when the tenant's store cannot be had now (its database does not answer):
//     the delivery waits and tries again, as it would for its own database being unreachable.
//
// It is an interface, not a function type, because what serves it usually holds state that
// outlives a call and must be closed — opened databases, a catalog's cache; TenantStoresFunc and
// TenantStoreMap adapt a function and a fixed map to it.
type TenantStores interface {
	TenantStore(ctx context.Context, tenant string) (store.Store, error)
}

// TenantStoresFunc adapts a function to TenantStores. It is called on every delivery, so it
// caches what it opens itself (or use NewTenantOpener).
type TenantStoresFunc func(ctx context.Context, tenant string) (store.Store, error)

// TenantStore calls f.
func (f TenantStoresFunc) TenantStore(ctx context.Context, tenant string) (store.Store, error) {
	return f(ctx, tenant)
}

// TenantStoreMap is a fixed set of tenants and their stores: a tenant not in it is unknown. It is
// read concurrently and must not be changed while a consumer uses it; a set that changes at run
// time is a TenantStoresFunc (over a map under a lock, or a catalog).
type TenantStoreMap map[string]store.Store

// TenantStore returns the tenant's store, or UnknownTenant(tenant).
func (m TenantStoreMap) TenantStore(_ context.Context, tenant string) (store.Store, error) {
	if st := m[tenant]; st != nil {
		return st, nil
	}
	return nil, UnknownTenant(tenant)
}

// TenantDatabase says where a tenant's database is: the URL store.Open opens, and its options.
// Tenants that share a Postgres server or a MySQL server, one schema each, share a URL and differ in
// Options.Schema.
type TenantDatabase struct {
	URL     string
	Options store.OpenOptions
}

// TenantOpener is TenantStores that opens each tenant's database by URL (store.Open) the first time
// a message of the tenant asks for it, and keeps it open until Close. Make it with
// NewTenantOpener. It is safe for concurrent use.
type TenantOpener struct {
	locate func(ctx context.Context, tenant string) (TenantDatabase, error)

	mu      sync.Mutex
	opened  map[string]*openedTenant
	retired []*store.DB // a tenant's stores opened before its database moved, closed at Close
	closed  bool
}

// openedTenant is one tenant's store, or its opening in progress (under mu).
type openedTenant struct {
	mu  sync.Mutex
	at  TenantDatabase
	db  *store.DB
	err error // set when the opener was closed during the open
}

// NewTenantOpener returns TenantStores that open tenants' databases by URL. locate says where a
// tenant's database is — from the service's configuration or a catalog of tenants — or returns an
// error wrapping ErrUnknownTenant (UnknownTenant(tenant)) for a tenant unknown or disabled; any
// other error holds the delivery, which tries again.
//
// locate is called on every delivery (so a tenant disabled in the catalog is served no more from
// its next message on): keep it cheap, caching the catalog's answers if it reads them from a
// database. A tenant's store is opened once per location: a location that changes (another URL,
// another schema) opens the new one, and the store at the old location is closed only by Close,
// since deliveries may still use it. A store that fails to open is not remembered: the next
// delivery of the tenant tries again. The program imports the drivers of its URLs' schemes, as for
// store.Open (store/pgsqlstore, mysqlstore, sqlitestore, or store/allstores). Every store opened
// works with *sql.Tx: a handler takes the inbox's transaction as one.
//
// Call Close once the consumer has stopped (the router's Run returned).
func NewTenantOpener(locate func(ctx context.Context, tenant string) (TenantDatabase, error)) *TenantOpener {
	return &TenantOpener{locate: locate, opened: map[string]*openedTenant{}}
}

// TenantStore returns the tenant's store, opening it if it is not open at the location locate
// gives.
func (o *TenantOpener) TenantStore(ctx context.Context, tenant string) (store.Store, error) {
	if o.locate == nil {
		return nil, errors.New("tenant opener: no locate function: make the opener with NewTenantOpener")
	}
	at, err := o.locate(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if at.URL == "" {
		return nil, fmt.Errorf("tenant %q: its location has no database URL", tenant)
	}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil, errOpenerClosed
	}
	t := o.opened[tenant]
	if t == nil {
		t = &openedTenant{}
		o.opened[tenant] = t
	}
	o.mu.Unlock()

	t.mu.Lock() // one open at a time per tenant; other tenants go on
	defer t.mu.Unlock()
	if t.err != nil {
		return nil, t.err
	}
	if t.db != nil && t.at == at {
		return t.db, nil
	}
	db, err := store.Open(ctx, at.URL, at.Options)
	if err != nil {
		return nil, fmt.Errorf("open the store of tenant %q: %w", tenant, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		_ = db.Close()
		return nil, errOpenerClosed
	}
	if t.db != nil {
		o.retired = append(o.retired, t.db)
	}
	t.at, t.db = at, db
	return db, nil
}

var errOpenerClosed = errors.New("tenant opener: closed")

// Close closes every store the opener opened. Stop the consumers using it first; after Close,
// TenantStore returns an error. It is safe to call more than once.
func (o *TenantOpener) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	tenants, retired := o.opened, o.retired
	o.opened, o.retired = nil, nil
	o.mu.Unlock()

	var errs []error
	for name, t := range tenants {
		t.mu.Lock() // waits for an open in progress
		if t.db != nil {
			if err := t.db.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close the store of tenant %q: %w", name, err))
			}
			t.db = nil
		}
		t.err = errOpenerClosed
		t.mu.Unlock()
	}
	for _, db := range retired {
		if err := db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close a tenant's store: %w", err))
		}
	}
	return errors.Join(errs...)
}
