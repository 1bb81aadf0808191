package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// relayCmd runs one member of a relay fleet until SIGTERM or SIGINT: `outboxctl relay --fleet
// NAME --coordination URL --broker URL --tenants FILE`; without --fleet and a catalog, the relay
// of the one outbox of --db (runOne).
func (e *env) relayCmd(ctx context.Context, args []string) error {
	fs := e.flags("relay")
	fleetName := fs.String("fleet", os.Getenv("OUTBOXKIT_FLEET"), "the fleet's name: members of one fleet share its outboxes (env OUTBOXKIT_FLEET)")
	coordination := fs.String("coordination", "", "URL of the coordination database holding the fleet's members and leases, migrated "+
		"(outboxctl --db URL migrate); default --db. Its schema is --schema")
	brokerURL := fs.String("broker", os.Getenv("OUTBOXKIT_BROKER_URL"), "broker URL every outbox publishes to (env OUTBOXKIT_BROKER_URL)")
	tenantsFile := fs.String("tenants", "", `the catalog: a JSON array of {"name","url","tenant","schema","relay","disabled"}, `+
		`or lines "name url [schema] [relay]" (# starts a comment); read at start: restart the members to change it`)
	tenantsDB := fs.String("tenants-db", "", "the catalog from a table: URL of the database holding it, read with --tenants-query at every tick")
	tenantsQuery := fs.String("tenants-query", "", "with --tenants-db: a query returning name and url, and any of tenant, schema, relay, enabled")
	member := fs.String("member", "", "this member's name, unique in the fleet (default host-pid-random, new at each start)")
	addr := fs.String("addr", "", "serve /metrics, /healthz and /readyz on this address (:9090); default none")
	leaseTTL := fs.Duration("lease-ttl", fleet.DefaultLeaseTTL, "the term of the member's heartbeat and leases: a member silent this long "+
		"is taken for dead and its outboxes taken")
	var one oneRelay
	fs.StringVar(&one.relay, "relay", envOr("OUTBOXKIT_RELAY", "poll"), "without --fleet: poll (any database) or log, the database's log: "+
		"Postgres's write-ahead log (wal_level = logical), or the binary log of MySQL or MariaDB (binlog_format = ROW, binlog_row_image = FULL, "+
		"a user with REPLICATION SLAVE and BINLOG MONITOR — REPLICATION CLIENT on MySQL) (env OUTBOXKIT_RELAY)")
	fs.StringVar(&one.name, "name", envOr("OUTBOXKIT_RELAY_NAME", forwarder.DefaultName), "without --fleet: the relay's name, in logs and metrics; "+
		"the log relay's group, which names its slot (Postgres) or its checkpoint and lock (MySQL) (env OUTBOXKIT_RELAY_NAME)")
	fs.StringVar(&one.logMode, "log-mode", envOr("OUTBOXKIT_LOG_MODE", string(pglog.ModeTable)), "with --relay log: table (writers insert rows) or wal "+
		"(writers emit logical messages; Postgres only) (env OUTBOXKIT_LOG_MODE)")
	fs.DurationVar(&one.txnInterval, "transaction-interval", 0, "without --fleet, with a transactional Kafka broker URL (transactional_id=): "+
		"the least time between two transactions while passes are not full")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	if *fleetName == "" && *tenantsFile == "" && *tenantsDB == "" {
		one.broker, one.addr = *brokerURL, *addr
		return e.runOne(ctx, one)
	}
	if *coordination == "" {
		*coordination = e.dbURL
	}
	switch {
	case *fleetName == "":
		return usagef("relay: pass --fleet NAME (or set OUTBOXKIT_FLEET): members of one fleet share its outboxes")
	case *coordination == "":
		return usagef("relay: pass --coordination URL (or --db): the database holding the fleet's members and leases (%s)", store.Schemes())
	case !strings.Contains(*coordination, "://"):
		return usagef("relay: --coordination %q is not a database URL: use one of %s", *coordination, store.Schemes())
	case *brokerURL == "":
		return usagef("relay: pass --broker URL (or set OUTBOXKIT_BROKER_URL): the broker every outbox publishes to")
	case (*tenantsFile == "") == (*tenantsDB == ""):
		return usagef("relay: pass the catalog, one of --tenants FILE or --tenants-db URL --tenants-query SQL")
	case (*tenantsDB == "") != (*tenantsQuery == ""):
		return usagef("relay: --tenants-db and --tenants-query go together: the query reads the catalog from that database")
	case *leaseTTL <= 0:
		return usagef("relay: --lease-ttl must be a positive duration (10s)")
	}

	cfg := fleet.Config{Fleet: *fleetName, Member: *member, Open: fleetstores.Opener(), LeaseTTL: *leaseTTL}
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}()
	catalog, closeCatalog, err := e.openCatalog(ctx, *tenantsFile, *tenantsDB, *tenantsQuery)
	if err != nil {
		return err
	}
	closers = append(closers, closeCatalog)
	cfg.Catalog = catalog
	coord, err := openExisting(ctx, *coordination, e.schema)
	if err != nil {
		return fmt.Errorf("open the coordination database: %w", err)
	}
	closers = append(closers, coord.Close)
	cfg.Coordination = coord
	fc, ok := store.FleetControlOf(coord)
	if !ok {
		return store.ErrNoFleetControl
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mm, err := prom.NewMemberMetrics(reg)
	if err != nil {
		return err
	}
	cfg.Metrics, cfg.ForwarderMetrics = mm, mm.Forwarder
	fm, err := prom.NewFleetMetrics(fc, *fleetName)
	if err != nil {
		return err
	}
	reg.MustRegister(fm)

	b, err := backends.Open(ctx, *brokerURL, backends.Options{})
	if err != nil {
		return fmt.Errorf("open the broker at %s: %w", store.RedactURL(*brokerURL), err)
	}
	closers = append(closers, b.Close)
	cfg.Publisher = b.Publisher

	m, err := fleet.New(cfg)
	if err != nil {
		return &usageError{err.Error()}
	}
	stopServing := func() error { return nil }
	served := ""
	if *addr != "" {
		if stopServing, served, err = serveMember(*addr, m, reg); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stdout, "outboxctl relay: member %s of fleet %s, coordination database %s %s%s\n", m.Name(), *fleetName,
		coord.Info().Name, coord.Info().Schema, served)
	err = m.Run(ctx)
	if serr := stopServing(); err == nil {
		err = serr
	}
	if err == nil {
		fmt.Fprintf(e.stdout, "outboxctl relay: member %s left fleet %s, its leases released\n", m.Name(), *fleetName)
	}
	return err
}

// openCatalog is the catalog of --tenants FILE (read now), or of --tenants-db URL with
// --tenants-query SQL (read at each use); closeCatalog closes its database.
func (e *env) openCatalog(ctx context.Context, tenantsFile, tenantsDB, tenantsQuery string) (c fleet.Catalog, closeCatalog func() error, err error) {
	if tenantsFile != "" {
		outboxes, err := readTenants(tenantsFile)
		if err != nil {
			return nil, nil, &usageError{err.Error()}
		}
		return outboxes, func() error { return nil }, nil
	}
	db, err := openExisting(ctx, tenantsDB, e.schema)
	if err != nil {
		return nil, nil, fmt.Errorf("open the catalog's database (--tenants-db): %w", err)
	}
	return fleet.TableCatalog(db.SQL, tenantsQuery), db.Close, nil
}

// openExisting opens a store by URL that must exist already (a SQLite file is not created).
func openExisting(ctx context.Context, url, schema string) (*store.DB, error) {
	if !strings.Contains(url, "://") {
		return nil, usagef("%q is not a database URL: use one of %s", url, store.Schemes())
	}
	opts := store.OpenOptions{Schema: schema, PollOnly: true}
	opts.MustExist = strings.HasPrefix(strings.ToLower(url), "sqlite://")
	return store.Open(ctx, url, opts)
}

// serveMember serves the member's /metrics, /healthz (the process runs) and /readyz (the member
// is live in its fleet: it has joined and its heartbeat lands) on addr, until stop is called.
func serveMember(addr string, m *fleet.Member, reg *prometheus.Registry) (stop func() error, banner string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", usagef("relay: --addr %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		st, err := m.Status(ctx)
		if err != nil {
			http.Error(w, "cannot read the coordination database: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		for _, mb := range st.Members {
			if mb.Name == m.Name() && mb.Live {
				fmt.Fprintf(w, "ready: member %s of fleet %s relays %d outboxes\n", mb.Name, st.Fleet, len(m.Owned()))
				return
			}
		}
		http.Error(w, fmt.Sprintf("member %s is not live in fleet %s yet", m.Name(), st.Fleet), http.StatusServiceUnavailable)
	})
	return serve(ln, mux), fmt.Sprintf(", /metrics /healthz /readyz on http://%s", ln.Addr()), nil
}

// serve serves mux on ln until stop, which gives the requests in progress 5 s to finish.
func serve(ln net.Listener, mux *http.ServeMux) (stop func() error) {
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(ctx)
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		return err
	}
}

// tenantEntry is one outbox of a --tenants JSON file.
type tenantEntry struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	Tenant   string `json:"tenant"`
	Schema   string `json:"schema"`
	Relay    string `json:"relay"`
	Disabled bool   `json:"disabled"`
}

// readTenants reads a --tenants file: a JSON array, or lines "name url [schema] [relay]".
func readTenants(path string) (fleet.Outboxes, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tenants: %w", err)
	}
	var out fleet.Outboxes
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '[' {
		var entries []tenantEntry
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&entries); err != nil {
			return nil, fmt.Errorf(`--tenants %s: %v: want a JSON array of {"name", "url", "tenant", "schema", "relay", "disabled"}`, path, err)
		}
		for i, t := range entries {
			if t.Name == "" || t.URL == "" {
				return nil, fmt.Errorf("--tenants %s: entry %d: name and url are required", path, i+1)
			}
			out = append(out, fleet.Outbox{Name: t.Name, URL: t.URL, Tenant: t.Tenant, Schema: t.Schema, Relay: t.Relay, Disabled: t.Disabled})
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			f := strings.Fields(line)
			if len(f) > 0 && strings.HasPrefix(f[0], "#") {
				continue
			}
			if len(f) == 0 {
				continue
			}
			if len(f) < 2 || len(f) > 4 || !strings.Contains(f[1], "://") {
				return nil, fmt.Errorf("--tenants %s line %d: want \"name url [schema] [relay]\", e.g. \"acme postgres://db-1/shop acme poll\"", path, n)
			}
			o := fleet.Outbox{Name: f[0], URL: f[1]}
			if len(f) > 2 {
				o.Schema = f[2]
			}
			if len(f) > 3 {
				o.Relay = f[3]
			}
			out = append(out, o)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--tenants %s: %w", path, err)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--tenants %s names no outbox", path)
	}
	return out, nil
}
