package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// tenantDB is one tenant's SQLite database, migrated, with an effects table, and a handle of the
// test's own to read it.
type tenantDB struct {
	URL   string
	Store *sqlitestore.Store
}

func newTenantDB(t *testing.T, name string) tenantDB {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".db")
	st, err := sqlitestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.DB().Close() })
	if _, err := pipeline.Migrate(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec(`CREATE TABLE effects (message_id TEXT PRIMARY KEY, tenant TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return tenantDB{URL: "sqlite://" + path, Store: st}
}

// effects lists "tenant/message" of every effect row in db.
func effects(t *testing.T, db *sql.DB) []string {
	t.Helper()
	return effectsIn(t, db, "effects")
}

// effectsIn lists "tenant/message" of every row of db's table.
func effectsIn(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT tenant, message_id FROM ` + table + ` ORDER BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var tenant, id string
		if err := rows.Scan(&tenant, &id); err != nil {
			t.Fatal(err)
		}
		got = append(got, tenant+"/"+id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// recordEffect is the consumer's handler: it writes the message's effect in the inbox's
// transaction, naming the tenant the message says it belongs to.
func recordEffect(applied *atomic.Int64) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		tx, ok, err := outboxkit.TxFrom[*sql.Tx](msg.Context())
		if err != nil || !ok {
			return fmt.Errorf("no inbox transaction (%v)", err)
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (message_id, tenant) VALUES (?, ?)`,
			msg.UUID, outboxkit.Tenant(msg)); err != nil {
			return err
		}
		applied.Add(1)
		return nil
	}
}

// consumerStats is the consumer's inbox statistics in st (zero when it has none there).
func consumerStats(t *testing.T, st store.Store, consumer string) middleware.ConsumerStats {
	t.Helper()
	stats, err := middleware.Stats(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Consumer == consumer {
			return s
		}
	}
	return middleware.ConsumerStats{}
}

func deadLetters(t *testing.T, st store.Store, consumer string) []store.DeadLetter {
	t.Helper()
	letters, err := st.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	return letters
}

func tenantEvent(tenant, key string) *message.Message {
	msg := pipeline.NewEvent("InvoiceRequested", key, []byte(`{}`))
	if tenant != "" {
		outboxkit.SetTenant(msg, tenant)
	}
	return msg
}

// broker is Watermill's in-process Pub/Sub, closed when the test ends.
func broker(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	bus := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = bus.Close() })
	return bus
}

// runTenantConsumer adds the tenant consumer "billing" reading "invoices" to a router and runs it
// until the test ends.
func runTenantConsumer(t *testing.T, bus *gochannel.GoChannel, cfg middleware.TenantStackConfig, h message.NoPublishHandlerFunc) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = -1
	}
	if _, err := middleware.AddTenantConsumerHandler(router, "billing", "invoices", bus, cfg, h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-router.Running()
}

func publish(t *testing.T, bus message.Publisher, msgs ...*message.Message) {
	t.Helper()
	if err := bus.Publish("invoices", msgs...); err != nil {
		t.Fatal(err)
	}
}

// Two tenants, each in its own database: every message is applied once, in its tenant's database
// only — inbox row and effect — and a redelivery is absorbed by that tenant's inbox.
func TestTenantConsumer_AppliesEachMessageInItsTenantsDatabase(t *testing.T) {
	acme, globex := newTenantDB(t, "acme"), newTenantDB(t, "globex")
	quarantine := migratedSQLite(t)
	opener := middleware.NewTenantOpener(func(_ context.Context, tenant string) (middleware.TenantDatabase, error) {
		switch tenant {
		case "acme":
			return middleware.TenantDatabase{URL: acme.URL}, nil
		case "globex":
			return middleware.TenantDatabase{URL: globex.URL}, nil
		}
		return middleware.TenantDatabase{}, middleware.UnknownTenant(tenant)
	})
	t.Cleanup(func() {
		if err := opener.Close(); err != nil {
			t.Error(err)
		}
	})
	bus := broker(t)
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{Tenants: opener, QuarantineStore: quarantine}, recordEffect(&applied))

	a1, a2, g1 := tenantEvent("acme", "inv-1"), tenantEvent("acme", "inv-2"), tenantEvent("globex", "inv-1")
	publish(t, bus, a1, g1, a2, a1.Copy()) // a1 twice: a redelivery

	if !testenv.Within(20*time.Second, func() bool {
		a, g := consumerStats(t, acme.Store, "billing"), consumerStats(t, globex.Store, "billing")
		return a.Processed == 2 && a.Duplicates == 1 && g.Processed == 1
	}) {
		t.Fatalf("acme %+v, globex %+v; want acme 2 processed and 1 duplicate, globex 1 processed",
			consumerStats(t, acme.Store, "billing"), consumerStats(t, globex.Store, "billing"))
	}
	wantAcme := []string{"acme/" + a1.UUID, "acme/" + a2.UUID}
	slices.Sort(wantAcme)
	if got := effects(t, acme.Store.DB()); !slices.Equal(got, wantAcme) {
		t.Errorf("acme's effects: %v, want %v", got, wantAcme)
	}
	if got := effects(t, globex.Store.DB()); !slices.Equal(got, []string{"globex/" + g1.UUID}) {
		t.Errorf("globex's effects: %v, want only its own message %s", got, g1.UUID)
	}
	if g := consumerStats(t, globex.Store, "billing"); g.Duplicates != 0 {
		t.Errorf("globex's inbox counted %d duplicates of acme's message", g.Duplicates)
	}
	if n := applied.Load(); n != 3 {
		t.Errorf("the handler applied %d effects for 3 messages", n)
	}
	if letters := deadLetters(t, quarantine, "billing"); len(letters) != 0 {
		t.Errorf("dead letters in the quarantine: %+v", letters)
	}
}

// poisoned collects the messages sent to the dead-letter topic.
func poisoned(t *testing.T, bus *gochannel.GoChannel, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := bus.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan *message.Message, 16)
	go func() {
		for m := range msgs {
			m.Ack()
			out <- m
		}
	}()
	return out
}

func receive(t *testing.T, c <-chan *message.Message, what string) *message.Message {
	t.Helper()
	select {
	case m := <-c:
		return m
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
		return nil
	}
}

// A message of a tenant no store serves is applied nowhere: it is dead-lettered in the quarantine
// store and to the dead-letter topic, with a reason naming the tenant.
func TestTenantConsumer_DeadLettersAnUnknownTenant(t *testing.T) {
	acme := newTenantDB(t, "acme")
	quarantine := migratedSQLite(t)
	bus := broker(t)
	dead := poisoned(t, bus, "invoices_dead")
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{
		Tenants:         middleware.TenantStoreMap{"acme": acme.Store},
		QuarantineStore: quarantine,
		StackConfig:     middleware.StackConfig{DeadLetterPublisher: bus, DeadLetterTopic: "invoices_dead"},
	}, recordEffect(&applied))

	ghost := tenantEvent("initech", "inv-1")
	publish(t, bus, ghost)
	letter := receive(t, dead, "dead letter on the topic")
	if letter.UUID != ghost.UUID {
		t.Fatalf("dead letter %s, want %s", letter.UUID, ghost.UUID)
	}
	reason := letter.Metadata.Get(wmiddleware.ReasonForPoisonedKey)
	if !strings.Contains(reason, `unknown tenant "initech"`) {
		t.Errorf("the topic's reason %q does not name the unknown tenant", reason)
	}
	letters := deadLetters(t, quarantine, "billing")
	if len(letters) != 1 || letters[0].MessageID != ghost.UUID || !strings.Contains(letters[0].Reason, `unknown tenant "initech"`) ||
		letters[0].Metadata[outboxkit.MetadataTenant] != "initech" {
		t.Fatalf("quarantine's dead letters: %+v; want %s with a reason naming tenant initech", letters, ghost.UUID)
	}
	if n := applied.Load(); n != 0 {
		t.Errorf("the handler ran %d times for a message of an unknown tenant", n)
	}
	if got := effects(t, acme.Store.DB()); len(got) != 0 {
		t.Errorf("acme's database holds effects of another tenant: %v", got)
	}
	if a := consumerStats(t, acme.Store, "billing"); a != (middleware.ConsumerStats{}) {
		t.Errorf("acme's inbox: %+v", a)
	}
	if letters := deadLetters(t, acme.Store, "billing"); len(letters) != 0 {
		t.Errorf("the dead letter landed in acme's database: %+v", letters)
	}
}

// A message naming no tenant is dead-lettered on its first delivery, here to the dead-letter
// topic alone (no quarantine store), and applied nowhere — even by tenant stores that would give a
// store for any name, "" included.
func TestTenantConsumer_DeadLettersAMessageWithoutTenant(t *testing.T) {
	acme := newTenantDB(t, "acme")
	bus := broker(t)
	dead := poisoned(t, bus, "invoices_dead")
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{
		Tenants: middleware.TenantStoresFunc(func(context.Context, string) (store.Store, error) {
			return acme.Store, nil
		}),
		StackConfig: middleware.StackConfig{DeadLetterPublisher: bus, DeadLetterTopic: "invoices_dead"},
		// Held, it would come back for an hour: a message without tenant never is.
		HoldUnknownFor: time.Hour,
	}, recordEffect(&applied))

	orphan := tenantEvent("", "inv-1")
	publish(t, bus, orphan)
	letter := receive(t, dead, "dead letter on the topic")
	if letter.UUID != orphan.UUID {
		t.Fatalf("dead letter %s, want %s", letter.UUID, orphan.UUID)
	}
	if reason := letter.Metadata.Get(wmiddleware.ReasonForPoisonedKey); !strings.Contains(reason, "names no tenant") {
		t.Errorf("the topic's reason %q does not say the message names no tenant", reason)
	}
	if n := applied.Load(); n != 0 {
		t.Errorf("the handler ran %d times for a message without tenant", n)
	}
	if got := effects(t, acme.Store.DB()); len(got) != 0 {
		t.Errorf("acme's database holds effects of a message without tenant: %v", got)
	}
}

// tenantCatalog is a set of tenants that changes while the consumer runs, counting the questions
// about each tenant.
type tenantCatalog struct {
	mu     sync.Mutex
	stores map[string]store.Store
	fail   map[string]error // tenants whose store cannot be had now
	asked  map[string]int
}

func newTenantCatalog() *tenantCatalog {
	return &tenantCatalog{stores: map[string]store.Store{}, fail: map[string]error{}, asked: map[string]int{}}
}

func (c *tenantCatalog) TenantStore(_ context.Context, tenant string) (store.Store, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[tenant]++
	if err := c.fail[tenant]; err != nil {
		return nil, err
	}
	if st := c.stores[tenant]; st != nil {
		return st, nil
	}
	return nil, middleware.UnknownTenant(tenant)
}

func (c *tenantCatalog) set(tenant string, st store.Store, fail error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stores[tenant], c.fail[tenant] = st, fail
}

func (c *tenantCatalog) times(tenant string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[tenant]
}

// clock is a test's clock, moved by hand.
type clock struct{ now atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

var tinyBackoff = outboxkit.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Multiplier: 2}

// With HoldUnknownFor, a message of an unknown tenant is given back to the broker again and again,
// never dead-lettered nor applied elsewhere: once its tenant appears it is applied in its database;
// once the hold has lasted HoldUnknownFor, it is dead-lettered.
func TestTenantConsumer_HoldsAnUnknownTenantForAWhile(t *testing.T) {
	acme, hooli := newTenantDB(t, "acme"), newTenantDB(t, "hooli")
	quarantine := migratedSQLite(t)
	catalog := newTenantCatalog()
	catalog.set("acme", acme.Store, nil)
	now := &clock{}
	now.Advance(time.Duration(time.Now().UnixNano()))
	bus := broker(t)
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{
		Tenants: catalog, QuarantineStore: quarantine,
		HoldUnknownFor: time.Hour, HoldBackoff: tinyBackoff,
		StackConfig: middleware.StackConfig{Now: now.Now},
	}, recordEffect(&applied))

	early, late := tenantEvent("hooli", "inv-1"), tenantEvent("umbrella", "inv-1")
	publish(t, bus, early, late)
	testenv.Eventually(t, 20*time.Second, "both messages held and delivered again", func() bool {
		return catalog.times("hooli") >= 5 && catalog.times("umbrella") >= 5
	})
	if letters := deadLetters(t, quarantine, "billing"); len(letters) != 0 {
		t.Fatalf("dead-lettered while held: %+v", letters)
	}
	if n := applied.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for held messages", n)
	}

	catalog.set("hooli", hooli.Store, nil) // the tenant appears
	testenv.Eventually(t, 20*time.Second, "the held message applied in its tenant's database", func() bool {
		return consumerStats(t, hooli.Store, "billing").Processed == 1
	})
	if got := effects(t, hooli.Store.DB()); !slices.Equal(got, []string{"hooli/" + early.UUID}) {
		t.Errorf("hooli's effects: %v", got)
	}

	now.Advance(time.Hour) // umbrella never appears
	testenv.Eventually(t, 20*time.Second, "the message of a tenant that never appeared dead-lettered", func() bool {
		return len(deadLetters(t, quarantine, "billing")) == 1
	})
	letter := deadLetters(t, quarantine, "billing")[0]
	if letter.MessageID != late.UUID || !strings.Contains(letter.Reason, `unknown tenant "umbrella"`) ||
		!strings.Contains(letter.Reason, "held for 1h0m0s") {
		t.Errorf("dead letter %s: %q; want %s, its reason naming the tenant and the hold", letter.MessageID, letter.Reason, late.UUID)
	}
	if got := effects(t, acme.Store.DB()); len(got) != 0 {
		t.Errorf("acme's database holds effects of other tenants: %v", got)
	}
	if n := applied.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (hooli's message)", n)
	}
}

// A tenant whose store cannot be had holds its message — not dead-lettered, not applied elsewhere,
// the store asked for again — until the store answers; then it is applied once, in its database.
func TestTenantConsumer_HoldsAMessageWhileItsTenantsStoreCannotBeHad(t *testing.T) {
	acme, globex := newTenantDB(t, "acme"), newTenantDB(t, "globex")
	quarantine := migratedSQLite(t)
	catalog := newTenantCatalog()
	catalog.set("acme", acme.Store, nil)
	catalog.set("globex", nil, outboxkit.Unreachable(errors.New("connection refused")))
	bus := broker(t)
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{
		Tenants: catalog, QuarantineStore: quarantine,
		StackConfig: middleware.StackConfig{CircuitBackoff: tinyBackoff},
	}, recordEffect(&applied))

	g1, a1 := tenantEvent("globex", "inv-1"), tenantEvent("acme", "inv-1")
	publish(t, bus, g1, a1)
	testenv.Eventually(t, 20*time.Second, "globex's store asked for again, acme's message applied", func() bool {
		return catalog.times("globex") >= 5 && consumerStats(t, acme.Store, "billing").Processed == 1
	})
	if got := effects(t, acme.Store.DB()); !slices.Equal(got, []string{"acme/" + a1.UUID}) {
		t.Fatalf("acme's effects: %v; want its own message only", got)
	}
	if letters := deadLetters(t, quarantine, "billing"); len(letters) != 0 {
		t.Fatalf("dead-lettered while its store could not be had: %+v", letters)
	}

	catalog.set("globex", globex.Store, nil)
	testenv.Eventually(t, 20*time.Second, "globex's message applied once its store answers", func() bool {
		return consumerStats(t, globex.Store, "billing").Processed == 1
	})
	if got := effects(t, globex.Store.DB()); !slices.Equal(got, []string{"globex/" + g1.UUID}) {
		t.Errorf("globex's effects: %v", got)
	}
	if n := applied.Load(); n != 2 {
		t.Errorf("the handler ran %d times for 2 messages", n)
	}
}

// namedSubscriber is a subscriber that names the consumer it reads for, as outboxkit's do.
type namedSubscriber struct {
	message.Subscriber
	consumer string
}

func (s namedSubscriber) Consumer() string { return s.consumer }

// Mistakes are said when the program starts, and nothing is added to the router.
func TestAddTenantConsumerHandler_RefusesAtStart(t *testing.T) {
	acme := newTenantDB(t, "acme")
	quarantine := migratedSQLite(t)
	bus := broker(t)
	tenants := middleware.TenantStoreMap{"acme": acme.Store}
	noop := func(*message.Message) error { return nil }
	for _, tc := range []struct {
		name string
		sub  message.Subscriber
		cfg  middleware.TenantStackConfig
		want []string
		is   error
	}{
		{"another consumer's subscriber", namedSubscriber{bus, "shipping"},
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing"}, Tenants: tenants, QuarantineStore: quarantine},
			[]string{`"shipping"`, `"billing"`, "same name"}, middleware.ErrWrongConsumer},
		{"nowhere to keep unknown tenants' messages", bus,
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing"}, Tenants: tenants},
			[]string{"set QuarantineStore or DeadLetterPublisher so messages of unknown tenants are kept"}, nil},
		{"no tenants", bus,
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing"}, QuarantineStore: quarantine},
			[]string{"field Tenants is required"}, nil},
		{"a store for every tenant", bus,
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing", Store: acme.Store},
				Tenants: tenants, QuarantineStore: quarantine},
			[]string{"leave StackConfig.Store nil"}, nil},
		{"a bad stack field", bus,
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing", MaxDeliveries: -1},
				Tenants: tenants, QuarantineStore: quarantine},
			[]string{"MaxDeliveries must be at least 1"}, nil},
		{"a bad hold", bus,
			middleware.TenantStackConfig{StackConfig: middleware.StackConfig{Consumer: "billing"}, Tenants: tenants, QuarantineStore: quarantine,
				HoldUnknownFor: -time.Second, HoldBackoff: outboxkit.Backoff{Initial: time.Second}},
			[]string{"HoldUnknownFor must not be negative", "HoldBackoff.Max"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			// Never run: a router that did not run is left to the collector.
			h, err := middleware.AddTenantConsumerHandler(router, "billing", "invoices", tc.sub, tc.cfg, noop)
			if err == nil || h != nil {
				t.Fatalf("got handler %v, error %v; want a refusal", h, err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("the error %q is not %v", err, tc.is)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error %q does not say %s", err, want)
				}
			}
			if n := len(router.Handlers()); n != 0 {
				t.Errorf("the router holds %d handlers after a refusal", n)
			}
		})
	}
}

// The opener opens a tenant's database once, gives the same store to every delivery, says unknown
// for what locate does not know, and closes what it opened.
func TestTenantOpener_OpensEachTenantOnceAndClosesThem(t *testing.T) {
	acme := newTenantDB(t, "acme")
	var located atomic.Int64
	opener := middleware.NewTenantOpener(func(_ context.Context, tenant string) (middleware.TenantDatabase, error) {
		located.Add(1)
		if tenant == "acme" {
			return middleware.TenantDatabase{URL: acme.URL}, nil
		}
		return middleware.TenantDatabase{}, middleware.UnknownTenant(tenant)
	})
	ctx := context.Background()
	first, err := opener.TenantStore(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	again, err := opener.TenantStore(ctx, "acme")
	if err != nil || again != first {
		t.Fatalf("asked again: %v (%v); want the store opened first", again, err)
	}
	if located.Load() != 2 {
		t.Errorf("locate called %d times for 2 questions", located.Load())
	}
	if _, err := opener.TenantStore(ctx, "initech"); !errors.Is(err, middleware.ErrUnknownTenant) ||
		!strings.Contains(err.Error(), `"initech"`) {
		t.Errorf("an unknown tenant: %v", err)
	}
	if err := opener.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.(*store.DB).SQL.Ping(); err == nil {
		t.Error("the tenant's store is still open after Close")
	}
	if _, err := opener.TenantStore(ctx, "acme"); err == nil {
		t.Error("a closed opener gave a store")
	}
	if err := opener.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// failingPublisher fails its first publishes, then publishes to the bus.
type failingPublisher struct {
	message.Publisher
	failures atomic.Int64
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.failures.Add(-1) >= 0 {
		return errors.New("the dead-letter topic refused the message")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// A message whose hold has ended but whose dead letter cannot be sent goes back to the broker and is
// dead-lettered on a later delivery: its hold does not start anew.
func TestTenantConsumer_AHoldEndsOnceEvenWhenTheDeadLetterFails(t *testing.T) {
	acme := newTenantDB(t, "acme")
	now := &clock{}
	now.Advance(time.Duration(time.Now().UnixNano()))
	bus := broker(t)
	dead := poisoned(t, bus, "invoices_dead")
	pub := &failingPublisher{Publisher: bus}
	pub.failures.Store(3)
	catalog := newTenantCatalog()
	catalog.set("acme", acme.Store, nil)
	runTenantConsumer(t, bus, middleware.TenantStackConfig{
		Tenants:        catalog,
		StackConfig:    middleware.StackConfig{DeadLetterPublisher: pub, DeadLetterTopic: "invoices_dead", Now: now.Now},
		HoldUnknownFor: time.Hour, HoldBackoff: tinyBackoff,
	}, func(*message.Message) error { return errors.New("never called") })

	ghost := tenantEvent("initech", "inv-1")
	publish(t, bus, ghost)
	testenv.Eventually(t, 20*time.Second, "the message held", func() bool { return catalog.times("initech") >= 3 })
	now.Advance(time.Hour)
	letter := receive(t, dead, "dead letter on the topic once the publisher takes it")
	if letter.UUID != ghost.UUID || pub.failures.Load() >= 0 {
		t.Fatalf("dead letter %s after %d refusals left; want %s after the 3 refusals", letter.UUID, pub.failures.Load(), ghost.UUID)
	}
}

// A tenant whose store changes (its database moved) is served on the new store from its next
// message on: the consumer builds the tenant's stack anew.
func TestTenantConsumer_FollowsATenantsStoreWhenItChanges(t *testing.T) {
	before, after := newTenantDB(t, "acme-before"), newTenantDB(t, "acme-after")
	catalog := newTenantCatalog()
	catalog.set("acme", before.Store, nil)
	bus := broker(t)
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{Tenants: catalog, QuarantineStore: migratedSQLite(t)},
		recordEffect(&applied))

	first, second := tenantEvent("acme", "inv-1"), tenantEvent("acme", "inv-2")
	publish(t, bus, first)
	testenv.Eventually(t, 20*time.Second, "the first message applied", func() bool {
		return consumerStats(t, before.Store, "billing").Processed == 1
	})
	catalog.set("acme", after.Store, nil)
	publish(t, bus, second)
	testenv.Eventually(t, 20*time.Second, "the second message applied in the new store", func() bool {
		return consumerStats(t, after.Store, "billing").Processed == 1
	})
	if got := effects(t, before.Store.DB()); !slices.Equal(got, []string{"acme/" + first.UUID}) {
		t.Errorf("the old store's effects: %v", got)
	}
	if got := effects(t, after.Store.DB()); !slices.Equal(got, []string{"acme/" + second.UUID}) {
		t.Errorf("the new store's effects: %v", got)
	}
}
