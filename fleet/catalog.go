package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxkit/outboxkit/store"
)

// Relays an outbox can have (Outbox.Relay).
const (
	// RelayPoll is the polling relay (package forwarder): every store.
	RelayPoll = "poll"
	// RelayLog is the log relay (package forwarder/pglog): Postgres with wal_level = logical.
	RelayLog = "log"
)

// DefaultSchema is the default of Outbox.Schema.
const DefaultSchema = "outboxkit"

// Outbox is one outbox of the fleet's catalog: a database, or a schema of one, holding
// outboxkit's tables, which one member at a time relays.
type Outbox struct {
	// Name identifies the outbox in the fleet ("tenant-317", "shard-3"): its lease, its relay's
	// name (forwarder Config.Name) and the MetadataOutbox of its messages. Unique in the catalog;
	// required.
	Name string
	// Tenant is stamped on each message as outboxkit.MetadataTenant. Default Name.
	Tenant string
	// URL is the database's URL, in store.Open's form (postgres://, mysql://, sqlite://).
	// Required.
	URL string
	// Schema is the Postgres schema or the MySQL database holding outboxkit's tables; SQLite,
	// one outbox per file, ignores it. Default DefaultSchema ("outboxkit").
	Schema string
	// Relay is RelayPoll (the default, every store) or RelayLog (Postgres's write-ahead log,
	// wal_level = logical; a replication connection for each outbox).
	Relay string
	// Disabled outboxes are known to the fleet (they show in Status) and relayed by nobody: their
	// owner stops and releases them.
	Disabled bool
}

// withDefaults fills in Tenant, Schema and Relay.
func (o Outbox) withDefaults() Outbox {
	if o.Tenant == "" {
		o.Tenant = o.Name
	}
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Relay == "" {
		o.Relay = RelayPoll
	}
	return o
}

// validate says what is wrong with an outbox whose defaults are filled in.
func (o Outbox) validate() error {
	var errs []error
	if strings.TrimSpace(o.Name) == "" {
		errs = append(errs, errors.New("field Name is required: name the outbox uniquely in the fleet (\"tenant-317\")"))
	}
	if o.URL == "" {
		errs = append(errs, errors.New("field URL is required: the URL of the database holding the outbox (postgres://, mysql://, sqlite://)"))
	}
	scheme, _, _ := strings.Cut(strings.ToLower(o.URL), "://")
	switch o.Relay {
	case RelayPoll:
	case RelayLog:
		if o.URL != "" && scheme != "postgres" && scheme != "postgresql" {
			errs = append(errs, fmt.Errorf("field Relay: the fleet's %q relay reads Postgres's write-ahead log, and URL is a %s:// URL: "+
				"use %q (the binlog relay of a MySQL or MariaDB outbox runs on its own: outboxctl relay --relay log, or forwarder/mysqlbinlog)",
				RelayLog, scheme, RelayPoll))
		}
	default:
		errs = append(errs, fmt.Errorf("field Relay must be %q or %q, got %q", RelayPoll, RelayLog, o.Relay))
	}
	if err := errors.Join(errs...); err != nil {
		if o.Name != "" {
			return fmt.Errorf("outbox %q: %w", o.Name, err)
		}
		return fmt.Errorf("outbox with URL %q: %w", store.RedactURL(o.URL), err)
	}
	return nil
}

// ErrCatalog marks a catalog that cannot be used as it is: a query whose columns TableCatalog
// cannot map, two outboxes of one name. It is not an outage: Run fails with it when the first
// catalog it reads has it, and keeps the last good catalog when a later one does.
var ErrCatalog = errors.New("fleet catalog")

// Catalog lists the outboxes the fleet relays. Run reads it at every Tick, so outboxes added,
// disabled or removed while the fleet runs are acquired or stopped within a tick or two; when it
// fails, the last catalog read stays in force. It is called from one goroutine at a time.
type Catalog interface {
	Outboxes(ctx context.Context) ([]Outbox, error)
}

// Outboxes is a fixed catalog, from configuration. New refuses one with an outbox that is not
// valid or two outboxes of one name.
type Outboxes []Outbox

// Outboxes returns the outboxes.
func (c Outboxes) Outboxes(context.Context) ([]Outbox, error) { return slices.Clone(c), nil }

// CatalogFunc is a Catalog of one function.
type CatalogFunc func(ctx context.Context) ([]Outbox, error)

// Outboxes calls f.
func (f CatalogFunc) Outboxes(ctx context.Context) ([]Outbox, error) { return f(ctx) }

// checkCatalog fills in the defaults of outboxes and sorts them out: the valid, and the errors of
// the others. Two outboxes of one name make the whole catalog unusable (ErrCatalog): which of the
// two is meant cannot be told.
func checkCatalog(outboxes []Outbox) (valid []Outbox, invalid map[string]error, err error) {
	seen := make(map[string]bool, len(outboxes))
	var dup []string
	for _, o := range outboxes {
		o = o.withDefaults()
		if seen[o.Name] && o.Name != "" {
			dup = append(dup, o.Name)
			continue
		}
		seen[o.Name] = true
		if err := o.validate(); err != nil {
			if invalid == nil {
				invalid = map[string]error{}
			}
			invalid[o.Name] = err
			continue
		}
		valid = append(valid, o)
	}
	if len(dup) > 0 {
		return nil, invalid, fmt.Errorf("%w: outbox names must be unique, and these appear more than once: %s",
			ErrCatalog, strings.Join(slices.Compact(slices.Sorted(slices.Values(dup))), ", "))
	}
	slices.SortFunc(valid, func(a, b Outbox) int { return strings.Compare(a.Name, b.Name) })
	return valid, invalid, nil
}

// tableColumns are the columns TableCatalog maps, and whether each is required.
var tableColumns = map[string]bool{"name": true, "url": true, "tenant": false, "schema": false, "relay": false, "enabled": false}

// TableCatalog reads the catalog from a table the application keeps (a row per tenant: its
// database's URL and schema), with query, at every Tick. The query's result columns are mapped
// by name (alias them: SELECT tenant_id AS name, …):
//
//	name     required  Outbox.Name
//	url      required  Outbox.URL
//	tenant   optional  Outbox.Tenant (NULL or absent: the name)
//	schema   optional  Outbox.Schema (NULL or absent: "outboxkit")
//	relay    optional  Outbox.Relay  (NULL or absent: "poll")
//	enabled  optional  false disables the outbox (a boolean, or 0/1; NULL or absent: enabled)
//
// A query with another column, or without name or url, is refused with ErrCatalog: Run fails at
// start with it. A row that is not a valid outbox (an unknown relay, say) is left out, logged, and
// shown in Status with its error; the other outboxes go on.
func TableCatalog(db *sql.DB, query string) Catalog {
	return &tableCatalog{db: db, query: query}
}

type tableCatalog struct {
	db    *sql.DB
	query string
}

func (c *tableCatalog) Outboxes(ctx context.Context) ([]Outbox, error) {
	if c.db == nil {
		return nil, fmt.Errorf("%w: TableCatalog has no database: pass the *sql.DB of the catalog's table", ErrCatalog)
	}
	rows, err := c.db.QueryContext(ctx, c.query)
	if err != nil {
		return nil, fmt.Errorf("read the catalog: %w", err)
	}
	defer func() { _ = rows.Close() }()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("read the catalog: %w", err)
	}
	index := map[string]int{}
	var unknown []string
	for i, col := range cols {
		col = strings.ToLower(col)
		if _, ok := tableColumns[col]; !ok {
			unknown = append(unknown, cols[i])
			continue
		}
		if _, dup := index[col]; dup {
			return nil, fmt.Errorf("%w: the catalog query returns column %q twice", ErrCatalog, col)
		}
		index[col] = i
	}
	var missing []string
	for col, required := range tableColumns {
		if _, ok := index[col]; required && !ok {
			missing = append(missing, col)
		}
	}
	if len(unknown) > 0 || len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("%w: the catalog query's columns must be name and url, and any of tenant, schema, relay, enabled "+
			"(alias them: SELECT tenant_id AS name, …); it returns %s%s%s", ErrCatalog, strings.Join(cols, ", "),
			listIf("; unknown: ", unknown), listIf("; missing: ", missing))
	}
	var out []Outbox
	for rows.Next() {
		var (
			text    = make([]sql.NullString, len(cols))
			enabled sql.NullBool
			dest    = make([]any, len(cols))
		)
		for i := range cols {
			dest[i] = &text[i]
		}
		if i, ok := index["enabled"]; ok {
			dest[i] = &enabled
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("read the catalog: %w", err)
		}
		get := func(col string) string {
			if i, ok := index[col]; ok {
				return text[i].String
			}
			return ""
		}
		out = append(out, Outbox{Name: get("name"), URL: get("url"), Tenant: get("tenant"), Schema: get("schema"),
			Relay: get("relay"), Disabled: enabled.Valid && !enabled.Bool})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the catalog: %w", err)
	}
	return out, nil
}

func listIf(prefix string, items []string) string {
	if len(items) == 0 {
		return ""
	}
	return prefix + strings.Join(items, ", ")
}
