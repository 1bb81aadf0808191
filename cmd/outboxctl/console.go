package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/store"
)

// consoleCmd runs the operator console alone: `outboxctl console --db URL [--broker URL]`; with
// --fleet NAME and a catalog, the console of a relay fleet whose coordination database is --db.
func (e *env) consoleCmd(ctx context.Context, args []string) error {
	fs := e.flags("console")
	addr := fs.String("addr", "127.0.0.1:8089", "listen address; beyond loopback it needs credentials")
	prefix := fs.String("prefix", "", "path prefix to serve under, e.g. /console")
	brokerURL := fs.String("broker", "", "broker URL: lets the console replay consumers' dead letters and read their backlog")
	consumers := fs.String("consumers", "", "the topics each consumer reads, for the backlog column: billing=shop.orders;search=shop.orders,shop.search")
	basicFile := fs.String("basic-auth-file", "", "htpasswd-style file of name:role:bcrypt-hash lines (role viewer or operator)")
	envName := fs.String("env", os.Getenv("OUTBOXKIT_ENVIRONMENT"), "environment shown in the top bar (production shows red)")
	hide := fs.Bool("hide-payloads", false, "never show or download payloads (personal data)")
	noJobs := fs.Bool("no-jobs", false, "do not run jobs here (another console runs them)")
	fleetName := fs.String("fleet", "", "the console of this relay fleet: --db is its coordination database, and each tenant's console "+
		"is opened from the catalog (--tenants or --tenants-db)")
	tenantsFile := fs.String("tenants", "", `with --fleet, the catalog: a JSON array of {"name","url","tenant","schema","relay","disabled"}, `+
		`or lines "name url [schema] [relay]", as outboxctl relay reads it`)
	tenantsDB := fs.String("tenants-db", "", "with --fleet, the catalog from a table: URL of the database holding it, read with --tenants-query")
	tenantsQuery := fs.String("tenants-query", "", "with --tenants-db: a query returning name and url, and any of tenant, schema, relay, enabled")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	switch {
	case *fleetName == "" && (*tenantsFile != "" || *tenantsDB != "" || *tenantsQuery != ""):
		return usagef("console: --tenants, --tenants-db and --tenants-query go with --fleet NAME: the catalog of that fleet")
	case *fleetName != "" && (*tenantsFile == "") == (*tenantsDB == ""):
		return usagef("console: --fleet needs the fleet's catalog, one of --tenants FILE or --tenants-db URL --tenants-query SQL")
	case (*tenantsDB == "") != (*tenantsQuery == ""):
		return usagef("console: --tenants-db and --tenants-query go together: the query reads the catalog from that database")
	}
	tokens, err := console.TokensFromEnv()
	if err != nil {
		return &usageError{err.Error()}
	}
	auth := console.Auth{Tokens: tokens}
	if *basicFile != "" {
		if auth.Basic, err = readBasicUsers(*basicFile); err != nil {
			return &usageError{err.Error()}
		}
	}
	if len(auth.Tokens) == 0 && len(auth.Basic) == 0 {
		auth.LocalOnly = true // the person at this machine, as an operator
	}
	cfg := console.Config{Prefix: *prefix, Auth: auth, Environment: *envName, HidePayloads: *hide, DisableJobs: *noJobs}
	if cfg.Consumers, err = parseConsumers(*consumers); err != nil {
		return &usageError{err.Error()}
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.Store = db
	if *brokerURL != "" {
		b, err := backends.Open(ctx, *brokerURL, backends.Options{})
		if err != nil {
			return fmt.Errorf("cannot open the broker at %s: %w", store.RedactURL(*brokerURL), err)
		}
		defer b.Close()
		cfg.Publisher = b.Publisher
		if b.ReportsLag() {
			cfg.Lag = func(ctx context.Context, topic, consumer string) (console.Lag, error) {
				l, err := b.Lag(ctx, topic, consumer)
				return console.Lag{Waiting: l.Waiting, Unacked: l.Unacked, HasUnacked: l.HasUnacked, OldestAge: l.OldestAge, HasAge: l.HasAge}, err
			}
		}
	}
	what := fmt.Sprintf("%s %s", db.Info().Name, db.Info().Schema)
	var h *console.Handler
	if *fleetName != "" {
		catalog, closeCatalog, err := e.openCatalog(ctx, *tenantsFile, *tenantsDB, *tenantsQuery)
		if err != nil {
			return err
		}
		defer func() { _ = closeCatalog() }()
		tenants := cfg
		tenants.Store, tenants.Prefix, tenants.Auth = nil, "", console.Auth{}
		h, err = console.NewFleet(console.FleetConfig{Coordination: db, Fleet: *fleetName, Catalog: catalog, Prefix: *prefix, Auth: auth,
			Open: fleetstores.Opener(fleetstores.PollOnly(), fleetstores.MaxConns(4)), Console: tenants})
		if err != nil {
			return &usageError{err.Error()}
		}
		what = fmt.Sprintf("fleet %s (coordination database %s)", *fleetName, what)
	} else if h, err = console.New(cfg); err != nil {
		return err
	}
	err = console.ListenAndServe(ctx, *addr, h, func(a string) {
		who := "signed in with a token (OUTBOXKIT_CONSOLE_TOKENS) or a basic-auth user"
		if auth.LocalOnly {
			who = "from this machine only, as an operator (set OUTBOXKIT_CONSOLE_TOKENS to let others in)"
		}
		fmt.Fprintf(e.stdout, "outboxkit console for %s on http://%s%s/ — %s\n", what, a, *prefix, who)
	})
	if errors.Is(err, console.ErrNoAuthOnNetwork) {
		return &usageError{err.Error()}
	}
	return err
}

// readBasicUsers reads name:role:bcrypt-hash lines; # starts a comment.
func readBasicUsers(path string) ([]console.BasicUser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--basic-auth-file: %w", err)
	}
	defer f.Close()
	var out []console.BasicUser
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("--basic-auth-file %s line %d: want name:role:bcrypt-hash (htpasswd -nbB name pass gives name:hash)", path, n)
		}
		role, err := console.ParseRole(parts[1])
		if err != nil {
			return nil, fmt.Errorf("--basic-auth-file %s line %d: %w", path, n, err)
		}
		out = append(out, console.BasicUser{Name: parts[0], Role: role, PasswordHash: []byte(parts[2])})
	}
	return out, sc.Err()
}

// parseConsumers reads billing=topic-a,topic-b;search=topic-a.
func parseConsumers(s string) (map[string][]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string][]string{}
	for _, part := range strings.Split(s, ";") {
		name, topics, ok := strings.Cut(part, "=")
		if !ok || name == "" || topics == "" {
			return nil, fmt.Errorf("--consumers %q: write consumer=topic[,topic];consumer=topic", s)
		}
		out[strings.TrimSpace(name)] = strings.Split(topics, ",")
	}
	return out, nil
}
