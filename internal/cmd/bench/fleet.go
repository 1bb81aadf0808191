package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// fleetParts are the parts --scenario fleet can measure, in the order it measures them.
var fleetParts = []string{"idle", "join", "drain"}

// fleetCoordSchema holds the fleet's coordination tables and the bench's catalog of tenants, in
// the bench's own database.
const fleetCoordSchema = "fleet_coord"

// fleetEvents is the drain's total of events when --events is not given.
const fleetEvents = 50000

// benchFleet measures a relay fleet (package fleet) over many schema tenants of one database,
// beside one stock forwarder per tenant: what an idle tenant costs (CPU, sessions, statements,
// memory), how soon a tenant added to the catalog is relayed, and the drain rate of many tenants.
// Everything lives in a database of its own, dropped at the end, so that its pg_stat_database row
// counts the relays' statements and no one else's.
func benchFleet(ctx context.Context, c config) ([]series, error) {
	parts, err := parseFleetParts(c.fleetParts)
	if err != nil {
		return nil, err
	}
	if !c.eventsSet {
		c.events = fleetEvents
	}
	if c.fleetTenants < 1 || c.fleetSmall < 1 || c.fleetSmall >= c.fleetTenants || c.fleetBaseline < 1 ||
		c.fleetDrainTenants < 1 || c.fleetJoin < 1 || c.events < c.fleetDrainTenants {
		return nil, fmt.Errorf("--fleet-tenants (%d) must exceed --fleet-small (%d), which must be at least 1; --fleet-baseline-tenants (%d), "+
			"--fleet-join (%d) and --fleet-drain-tenants (%d) must be at least 1, and --events (%d) at least --fleet-drain-tenants",
			c.fleetTenants, c.fleetSmall, c.fleetBaseline, c.fleetJoin, c.fleetDrainTenants, c.events)
	}
	b, err := newFleetBench(ctx, c, parts)
	if err != nil {
		return nil, err
	}
	defer b.close()
	var out []series
	if parts["idle"] || parts["join"] {
		r, err := b.idleAndJoin(ctx, parts)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	if parts["drain"] {
		r, err := b.drain(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}

// parseFleetParts reads --fleet-parts: a comma-separated subset of fleetParts.
func parseFleetParts(s string) (map[string]bool, error) {
	parts := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(fleetParts, p) {
			return nil, fmt.Errorf("--fleet-parts: %q is not a part: use %s", p, strings.Join(fleetParts, ", "))
		}
		parts[p] = true
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("--fleet-parts is empty: use any of %s", strings.Join(fleetParts, ", "))
	}
	return parts, nil
}

// fleetBench is the bench's database: its tenants' schemas, migrated, and the catalog listing
// them, with the connections that made them.
type fleetBench struct {
	c        config
	dbName   string
	dbURL    string        // the bench's database, without application_name
	admin    *pgxpool.Pool // the server's usual database (--db): CREATE and DROP DATABASE, pg_stat_*
	pool     *pgxpool.Pool // the bench's database: setup, writers
	tenants  []string      // schemas t000…, in the catalog with idx 0…
	joiners  []string      // schemas j000…, migrated, added to the catalog by the join part
	tag      string        // unique to this run: application names, topics, fleet names
	maxConns int           // the server's max_connections
}

func newFleetBench(ctx context.Context, c config, parts map[string]bool) (b *fleetBench, err error) {
	tag := fmt.Sprintf("%d", os.Getpid())
	b = &fleetBench{c: c, dbName: "outboxkit_bench_fleet_" + tag, tag: tag}
	b.dbURL, err = withDatabase(c.dbURL, b.dbName)
	if err != nil {
		return nil, err
	}
	if b.admin, err = fleetPool(ctx, c.dbURL, "outboxkit-bench-fleet-admin-"+tag, 2); err != nil {
		return nil, err
	}
	var maxConns string
	if err := b.admin.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil {
		b.admin.Close()
		return nil, err
	}
	b.maxConns, _ = strconv.Atoi(maxConns)
	if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+b.dbName); err != nil {
		b.admin.Close()
		return nil, fmt.Errorf("create the bench's database %s: %w", b.dbName, err)
	}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if b.pool, err = fleetPool(ctx, b.dbURL, "outboxkit-bench-fleet-setup-"+tag, 4); err != nil {
		return nil, err
	}
	n := 0
	if parts["idle"] || parts["join"] {
		n = max(c.fleetTenants, c.fleetBaseline)
	}
	if parts["drain"] {
		n = max(n, c.fleetDrainTenants)
	}
	for i := range n {
		b.tenants = append(b.tenants, fmt.Sprintf("t%03d", i))
	}
	if parts["join"] {
		for i := range c.fleetJoin {
			b.joiners = append(b.joiners, fmt.Sprintf("j%03d", i))
		}
	}
	t0 := time.Now()
	if _, err := pipeline.Migrate(ctx, storeIn(b.pool, fleetCoordSchema, pgxstore.Config{})); err != nil {
		return nil, fmt.Errorf("migrate the coordination schema: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+fleetCoordSchema+`.bench_tenants (
		name text PRIMARY KEY, idx int NOT NULL, joiner boolean NOT NULL DEFAULT false)`); err != nil {
		return nil, err
	}
	if err := migrateSchemas(ctx, b.pool, append(slices.Clone(b.tenants), b.joiners...)); err != nil {
		return nil, err
	}
	for i, t := range b.tenants {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+fleetCoordSchema+`.bench_tenants (name, idx) VALUES ($1, $2)`, t, i); err != nil {
			return nil, err
		}
	}
	fmt.Printf("\nfleet: schema tenants of one database (%s, dropped at the end) → RabbitMQ, %d reps\n", b.dbName, c.reps)
	fmt.Printf("  setup: %d tenant schemas and the coordination schema migrated in %.1fs\n", len(b.tenants)+len(b.joiners), time.Since(t0).Seconds())
	return b, nil
}

// close drops the bench's database, whatever its sessions are doing, and closes the pools.
func (b *fleetBench) close() {
	if b.pool != nil {
		b.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+b.dbName+" WITH (FORCE)"); err != nil {
		fmt.Fprintf(os.Stderr, "bench: drop the bench's database %s (drop it by hand): %v\n", b.dbName, err)
	}
	b.admin.Close()
}

// appURL is the bench's database URL with application_name set, so that pg_stat_activity tells
// one process's sessions from another's.
func (b *fleetBench) appURL(app string) string {
	u, _ := url.Parse(b.dbURL) // withDatabase parsed it
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// catalogQuery is the TableCatalog query of a member relaying the first n tenants and every
// joiner added: every outbox's URL carries the member's application_name.
func (b *fleetBench) catalogQuery(n int, app string) string {
	return fmt.Sprintf(`SELECT name, '%s' AS url, name AS schema FROM %s.bench_tenants WHERE idx < %d OR joiner`,
		strings.ReplaceAll(b.appURL(app), "'", "''"), fleetCoordSchema, n)
}

// truncate empties the outboxes of schemas: a drain starts from its own backlog only.
func (b *fleetBench) truncate(ctx context.Context, schemas []string) error {
	var names []string
	for _, s := range schemas {
		names = append(names, s+".outbox")
	}
	_, err := b.pool.Exec(ctx, "TRUNCATE "+strings.Join(names, ", "))
	return err
}

// withDatabase is the postgres:// URL raw with its database replaced by name.
func withDatabase(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("--scenario fleet needs --db as a postgres:// URL (it makes a database of its own on that server), got %s",
			redactURL(raw))
	}
	u.Path = "/" + name
	return u.String(), nil
}

// fleetPool is a pool of at most maxConns connections to rawURL, named app.
func fleetPool(ctx context.Context, rawURL, app string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach Postgres at %s: %w", redactURL(rawURL), err)
	}
	return pool, nil
}

// migrateSchemas migrates outboxkit's tables into each schema, a few at once.
func migrateSchemas(ctx context.Context, pool *pgxpool.Pool, schemas []string) error {
	work := make(chan string)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				if _, err := pipeline.Migrate(ctx, storeIn(pool, s, pgxstore.Config{})); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("migrate schema %s: %w", s, err))
					mu.Unlock()
				}
			}
		}()
	}
	for _, s := range schemas {
		work <- s
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// writeEvents commits, in one transaction, one event to each of schemas (woken by NOTIFY), keyed
// by its schema, to topic.
func writeEvents(ctx context.Context, pool *pgxpool.Pool, schemas []string, topic string, extra func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if extra != nil {
		if err := extra(tx); err != nil {
			return err
		}
	}
	for _, s := range schemas {
		p, err := pipeline.NewPublisher(storeIn(pool, s, pgxstore.Config{}), tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := p.Publish(topic, pipeline.NewEvent("TenantEvent", s, []byte(`{"tenant":"`+s+`"}`))); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
