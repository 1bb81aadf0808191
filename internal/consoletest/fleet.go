package consoletest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// GlobexReason is the error of globex's one dead letter.
const GlobexReason = "warehouse 7 is closed for stocktaking"

// Fleet is a fleet "shop" in a SQLite coordination database: member relay-1 owns acme and
// globex (whose outbox is globex-eu); initech is in the catalog and owned by nobody. Each tenant
// is a SQLite file of its own: acme holds Seed's incident, globex one dead letter of its own
// (GlobexReason), initech nothing.
type Fleet struct {
	Coord   *sqlitestore.Store
	Control store.FleetControl
	Catalog fleet.Outboxes
}

// SeedFleet builds the Fleet, its leases set through store.FleetControl as a member sets them.
func SeedFleet(t testing.TB) *Fleet {
	t.Helper()
	ctx := context.Background()
	f := &Fleet{Coord: OpenStore(t)}
	fc, ok := store.FleetControlOf(f.Coord)
	if !ok {
		t.Fatal("the SQLite store keeps no fleet")
	}
	f.Control = fc
	tenant := func(name string) string {
		path := filepath.Join(t.TempDir(), name+".db")
		s, err := sqlitestore.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.DB().Close() }()
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		switch name {
		case "acme":
			Seed(t, s)
		case "globex":
			if err := s.Session().DeadLetter(ctx, store.InboxDeadLetter{Consumer: "shipping", Topic: "shop.orders", MessageID: "globex-000001",
				Payload: []byte(`{"order_id":"g-1"}`), Metadata: []byte(`{"outboxkit_event_type":"OrderPlaced"}`), Reason: GlobexReason,
				Deliveries: 1, Now: time.Now().Add(-time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
		return "sqlite://" + path
	}
	f.Catalog = fleet.Outboxes{
		{Name: "acme", URL: tenant("acme")},
		{Name: "globex-eu", Tenant: "globex", URL: tenant("globex")},
		{Name: "initech", URL: tenant("initech")},
	}
	if _, err := fc.FleetHeartbeat(ctx, "shop", store.FleetMember{Name: "relay-1", Host: "host-1", PID: 101, Started: time.Now()}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"acme", "globex-eu"} {
		if _, ok, err := fc.AcquireLease(ctx, "shop", name, "relay-1", time.Hour); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", name, ok, err)
		}
	}
	if err := fc.RecordFleetOutboxes(ctx, "shop", "relay-1", []store.FleetOutbox{
		{Name: "acme", Tenant: "acme", Pending: 3, OldestPendingAge: 90 * time.Second, StatsAt: time.Now()},
		{Name: "globex-eu", Tenant: "globex", StatsAt: time.Now()},
		{Name: "initech", Tenant: "initech"},
	}, time.Hour); err != nil {
		t.Fatal(err)
	}
	return f
}

// Handler is a started console of the fleet under /ops, signing in Tokens; tune adjusts its
// configuration first. It is stopped when the test ends.
func (f *Fleet) Handler(t testing.TB, tune ...func(*console.FleetConfig)) *console.Handler {
	t.Helper()
	cfg := console.FleetConfig{Coordination: f.Coord, Fleet: "shop", Catalog: f.Catalog, Prefix: "/ops",
		Auth: console.Auth{Tokens: Tokens}, Console: console.Config{Environment: "test"}}
	for _, fn := range tune {
		fn(&cfg)
	}
	h, err := console.NewFleet(cfg)
	return started(t, h, err)
}
