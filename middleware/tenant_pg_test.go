package middleware_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/pgsqlstore" // postgres:// for the tenant opener
)

// pgTenant is one tenant's schema on the shared Postgres server (OUTBOXKIT_TEST_POSTGRES_URL),
// migrated, with an effects table, and where the opener finds it: the server's URL with the
// tenant's schema as its search_path, so that the handler's unqualified statements land in it.
func pgTenant(t *testing.T) (*testenv.PG, middleware.TenantDatabase) {
	t.Helper()
	pg := testenv.NewPG(t)
	pg.Exec(t, `CREATE TABLE {{schema}}.effects (message_id TEXT PRIMARY KEY, tenant TEXT NOT NULL)`)
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", string(pg.Schema))
	u.RawQuery = q.Encode()
	return pg, middleware.TenantDatabase{URL: u.String(),
		Options: store.OpenOptions{Schema: string(pg.Schema), MaxConns: 4, PollOnly: true}}
}

// Two tenants, a schema each on one Postgres server, opened by URL: every message is applied once,
// inbox row and effect in its tenant's schema only, and a redelivery is absorbed there.
func TestTenantConsumer_PostgresSchemaPerTenant(t *testing.T) {
	acme, acmeAt := pgTenant(t)
	globex, globexAt := pgTenant(t)
	quarantine := migratedSQLite(t)
	opener := middleware.NewTenantOpener(func(_ context.Context, tenant string) (middleware.TenantDatabase, error) {
		switch tenant {
		case "acme":
			return acmeAt, nil
		case "globex":
			return globexAt, nil
		}
		return middleware.TenantDatabase{}, middleware.UnknownTenant(tenant)
	})
	t.Cleanup(func() { // before the schemas are dropped
		if err := opener.Close(); err != nil {
			t.Error(err)
		}
	})
	bus := broker(t)
	var applied atomic.Int64
	runTenantConsumer(t, bus, middleware.TenantStackConfig{Tenants: opener, QuarantineStore: quarantine},
		func(msg *message.Message) error {
			tx, ok, err := outboxkit.TxFrom[*sql.Tx](msg.Context())
			if err != nil || !ok {
				return fmt.Errorf("no inbox transaction (%v)", err)
			}
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (message_id, tenant) VALUES ($1, $2)`,
				msg.UUID, outboxkit.Tenant(msg)); err != nil {
				return err
			}
			applied.Add(1)
			return nil
		})

	a1, a2, g1 := tenantEvent("acme", "inv-1"), tenantEvent("acme", "inv-2"), tenantEvent("globex", "inv-1")
	publish(t, bus, a1, g1, a2, g1.Copy()) // g1 twice: a redelivery

	if !testenv.Within(30*time.Second, func() bool {
		a, g := consumerStats(t, acme.Store, "billing"), consumerStats(t, globex.Store, "billing")
		return a.Processed == 2 && g.Processed == 1 && g.Duplicates == 1
	}) {
		t.Fatalf("acme %+v, globex %+v; want acme 2 processed, globex 1 processed and 1 duplicate",
			consumerStats(t, acme.Store, "billing"), consumerStats(t, globex.Store, "billing"))
	}
	wantAcme := []string{"acme/" + a1.UUID, "acme/" + a2.UUID}
	slices.Sort(wantAcme)
	if got := effectsIn(t, acme.DB, acme.Schema.Ident()+".effects"); !slices.Equal(got, wantAcme) {
		t.Errorf("acme's effects: %v, want %v", got, wantAcme)
	}
	if got := effectsIn(t, globex.DB, globex.Schema.Ident()+".effects"); !slices.Equal(got, []string{"globex/" + g1.UUID}) {
		t.Errorf("globex's effects: %v, want only its own message %s", got, g1.UUID)
	}
	if a := consumerStats(t, acme.Store, "billing"); a.Duplicates != 0 {
		t.Errorf("acme's inbox counted %d duplicates of globex's message", a.Duplicates)
	}
	if n := applied.Load(); n != 3 {
		t.Errorf("the handler applied %d effects for 3 messages", n)
	}
}
