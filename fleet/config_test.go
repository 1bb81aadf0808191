package fleet_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

// noFleet is a store whose driver keeps no fleet.
type noFleet struct{ store.Store }

func (noFleet) Info() store.Info { return store.Info{Name: "a store of another kind"} }

func TestNew_RefusesABadConfigAndSaysWhy(t *testing.T) {
	dir := t.TempDir()
	coord := sqliteCoordination(t, dir)
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer func() { _ = pub.Close() }()
	ok := func(c fleet.Config) fleet.Config {
		if c.Coordination == nil {
			c.Coordination = coord
		}
		if c.Catalog == nil {
			c.Catalog = fleet.Outboxes{{Name: "a", URL: "sqlite://a.db"}}
		}
		if c.Publisher == nil {
			c.Publisher = pub
		}
		if c.Open == nil {
			c.Open = func(context.Context, fleet.Outbox) (fleet.Opened, error) { return fleet.Opened{}, errors.New("unused") }
		}
		return c
	}
	if _, err := fleet.New(ok(fleet.Config{})); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	_, err := fleet.New(fleet.Config{})
	for _, want := range []string{"Coordination is required", "Catalog is required", "Open is required", "Publisher is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the zero config: got %v, want it to say %q", err, want)
		}
	}
	for want, c := range map[string]fleet.Config{
		"cannot coordinate a relay fleet":                                   {Coordination: noFleet{}},
		"appear more than once: a":                                          {Catalog: fleet.Outboxes{{Name: "a", URL: "sqlite://a.db"}, {Name: "a", URL: "sqlite://b.db"}}},
		`outbox "b": field Relay: the fleet's "log" relay reads Postgres's`: {Catalog: fleet.Outboxes{{Name: "b", URL: "mysql://h/db", Relay: fleet.RelayLog}}},
		`Relay must be "poll" or "log", got "wal"`:                          {Catalog: fleet.Outboxes{{Name: "c", URL: "sqlite://c.db", Relay: "wal"}}},
		"URL is required":                                                   {Catalog: fleet.Outboxes{{Name: "d"}}},
		"Name is required":                                                  {Catalog: fleet.Outboxes{{URL: "sqlite://e.db"}}},
		"StopBefore (10s) must be less than LeaseTTL":                       {LeaseTTL: 10 * time.Second, StopBefore: 10 * time.Second},
		"RenewInterval (5s) must be at most":                                {RenewInterval: 5 * time.Second},
		"Tick must be positive":                                             {Tick: -time.Second},
		"Forwarder.Store, Forwarder.Publisher and Forwarder.Name are set for each outbox": {Forwarder: forwarder.Config{Name: "x"}},
		"field Forwarder: forwarder config: BatchSize must be at least 1":                 {Forwarder: forwarder.Config{BatchSize: -1}},
		"IdlePollInterval must be 0 (off) or at least PollInterval":                       {Forwarder: forwarder.Config{PollInterval: time.Second, IdlePollInterval: time.Millisecond}},
		"a transactional id belongs to one outbox":                                        {Publisher: transactionalPublisher{}},
	} {
		if _, err := fleet.New(ok(c)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error saying %q", err, want)
		}
	}
}

// A coordination database that is not migrated ends Run at once, saying so.
func TestRun_RefusesACoordinationDatabaseNotMigrated(t *testing.T) {
	coord := openSQLite(t, filepath.Join(t.TempDir(), "empty.db"))
	m, err := fleet.New(fleet.Config{Coordination: coord, Catalog: fleet.Outboxes{}, Publisher: newRecorder(t),
		Open: func(context.Context, fleet.Outbox) (fleet.Opened, error) { return fleet.Opened{}, errors.New("unused") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Run(ctx); !errors.Is(err, store.ErrNotMigrated) {
		t.Errorf("Run on a coordination database not migrated: %v, want store.ErrNotMigrated", err)
	}
}

// TableCatalog maps its query's columns by name, with defaults for those it leaves out or NULL.
func TestTableCatalog_MapsColumnsByName(t *testing.T) {
	db := openSQLite(t, filepath.Join(t.TempDir(), "catalog.db")).DB()
	exec(t, db, `CREATE TABLE tenants (id TEXT, dsn TEXT, sch TEXT, relay TEXT, active INTEGER, region TEXT)`)
	exec(t, db, `INSERT INTO tenants VALUES ('t1', 'postgres://h/db', 'tenant_1', NULL, 1, 'eu'),
		('t2', 'postgres://h/db', NULL, 'log', 0, 'us'), ('t3', 'sqlite://t3.db', NULL, NULL, NULL, 'eu')`)
	got, err := fleet.TableCatalog(db, `SELECT id AS name, dsn AS url, sch AS schema, relay, active AS enabled
		FROM tenants ORDER BY id`).Outboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []fleet.Outbox{
		{Name: "t1", URL: "postgres://h/db", Schema: "tenant_1"},
		{Name: "t2", URL: "postgres://h/db", Relay: "log", Disabled: true},
		{Name: "t3", URL: "sqlite://t3.db"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, got[i], want[i])
		}
	}

	for query, wants := range map[string][]string{
		`SELECT id AS name, dsn AS url, region FROM tenants`: {"unknown: region"},
		`SELECT id AS name FROM tenants`:                     {"missing: url"},
		`SELECT dsn AS url, sch FROM tenants`:                {"unknown: sch", "missing: name"},
	} {
		_, err := fleet.TableCatalog(db, query).Outboxes(context.Background())
		if !errors.Is(err, fleet.ErrCatalog) {
			t.Errorf("%s: got %v, want ErrCatalog", query, err)
		}
		for _, w := range wants {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: got %v, want it to say %q", query, err, w)
			}
		}
	}
}

// A catalog query whose columns cannot be mapped ends Run at once: no member starts on it.
func TestRun_RefusesACatalogItCannotRead(t *testing.T) {
	dir := t.TempDir()
	db := openSQLite(t, filepath.Join(dir, "catalog.db")).DB()
	exec(t, db, `CREATE TABLE tenants (id TEXT, dsn TEXT)`)
	m, err := fleet.New(fleet.Config{Coordination: sqliteCoordination(t, dir), Catalog: fleet.TableCatalog(db, `SELECT id, dsn FROM tenants`),
		Publisher: newRecorder(t), Open: func(context.Context, fleet.Outbox) (fleet.Opened, error) { return fleet.Opened{}, errors.New("unused") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Run(ctx); !errors.Is(err, fleet.ErrCatalog) || !strings.Contains(err.Error(), "alias them") {
		t.Errorf("Run on a catalog query without name and url: %v, want ErrCatalog saying how to alias", err)
	}
}

func exec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.Exec(query); err != nil {
		t.Fatal(err)
	}
}

// transactionalPublisher is a publisher with Kafka-like transactions, which a fleet refuses.
type transactionalPublisher struct {
	forwarder.TransactionalPublisher
}
