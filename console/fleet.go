package console

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/store"
)

// Defaults for FleetConfig fields left at their zero value.
const (
	DefaultFleetPageSize = 100
	DefaultMaxOpen       = 16
)

// FleetConfig configures the console of a relay fleet (package fleet): a page for the fleet, and
// the console of each tenant's store under it. Zero values take the documented defaults; NewFleet
// names a bad field.
type FleetConfig struct {
	// Coordination is the fleet's coordination database: a store whose driver implements
	// store.FleetControl (every driver of this module does). Required.
	Coordination store.Store
	// Fleet is the fleet's name, as its members are given it. Required.
	Fleet string
	// Catalog lists the fleet's outboxes, as the members are given it (fleet.TableCatalog,
	// fleet.Outboxes): each tenant's database URL and schema. It is read at most once every
	// Console.CacheTTL; while it cannot be read, the last catalog read stays in force. Required.
	Catalog fleet.Catalog
	// Open opens a tenant's store the first time its console is asked for: fleetstores.Opener()
	// shares one database handle between the tenants of one database (a schema each). Default:
	// store.Open with the outbox's URL and Schema, polling only, 4 connections, a SQLite file
	// that must exist (the program imports the drivers it needs).
	Open fleet.Opener
	// MaxOpen is how many tenants' consoles, and their stores, stay open at once: past it, the
	// console used least lately is stopped and its store closed (a job it was running keeps its
	// state and resumes once its lease runs out). Default 16.
	MaxOpen int
	// PageSize is how many outboxes a page of the fleet page lists. Default 100, at most 1000.
	PageSize int

	// Prefix is the path the handler is mounted at, as Config's: the fleet page is Prefix/, the
	// console of each tenant Prefix/t/{tenant}/. Default "" (the root).
	Prefix string
	// Auth says who may look and who may act, on the fleet page and on every tenant's console
	// alike: one sign-in serves them all. NewFleet refuses a handler with no way in.
	Auth Auth

	// Console is what every tenant's console is configured with (Publisher, Lag, Consumers,
	// Environment, HidePayloads, …); NewFleet sets its Store, Prefix and Auth, which must be left
	// empty. Its Environment, Logger, Now and CacheTTL serve the fleet page too.
	Console Config
}

func (c FleetConfig) withDefaults() FleetConfig {
	if c.MaxOpen == 0 {
		c.MaxOpen = DefaultMaxOpen
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultFleetPageSize
	}
	if c.Open == nil {
		c.Open = openByURL
	}
	return c
}

// openByURL is FleetConfig.Open's default: store.Open, which reaches the drivers the program
// registered by importing them.
func openByURL(ctx context.Context, o fleet.Outbox) (fleet.Opened, error) {
	opts := store.OpenOptions{Schema: o.Schema, PollOnly: true, MaxConns: 4,
		MustExist: strings.HasPrefix(strings.ToLower(o.URL), "sqlite://")}
	db, err := store.Open(ctx, o.URL, opts)
	if err != nil {
		return fleet.Opened{}, err
	}
	return fleet.Opened{Store: db, Close: db.Close}, nil
}

// NewFleet validates cfg and builds the console of a fleet. Its pages: the fleet (its members,
// then its outboxes, those without an owner first), filtered by tenant and paged; and, under
// Prefix/t/{tenant}/, the console of that tenant's store, every page of New's, opened on first
// use from the catalog. Start starts the tenants' consoles as they open, Stop stops them and
// closes their stores. It does not touch a database.
func NewFleet(cfg FleetConfig) (*Handler, error) {
	cfg = cfg.withDefaults()
	var errs []error
	var fc store.FleetControl
	if cfg.Coordination == nil {
		errs = append(errs, errors.New("field Coordination is required: pass the store of the fleet's coordination database"))
	} else if c, ok := store.FleetControlOf(cfg.Coordination); ok {
		fc = c
	} else {
		errs = append(errs, fmt.Errorf("field Coordination: %T does not implement store.FleetControl (every driver of this module does)", cfg.Coordination))
	}
	if strings.TrimSpace(cfg.Fleet) == "" {
		errs = append(errs, errors.New("field Fleet is required: the fleet's name, as its members are given it"))
	}
	if cfg.Catalog == nil {
		errs = append(errs, errors.New("field Catalog is required: the fleet's outboxes, as its members are given them (fleet.TableCatalog, fleet.Outboxes)"))
	}
	if cfg.MaxOpen < 1 || cfg.PageSize < 1 || cfg.PageSize > 1000 {
		errs = append(errs, fmt.Errorf("fields MaxOpen (%d) and PageSize (%d) must be positive, PageSize at most 1000", cfg.MaxOpen, cfg.PageSize))
	}
	c := cfg.Console
	if c.Store != nil || c.Prefix != "" || c.Auth.hasCredentials() || c.Auth.LocalOnly || len(c.Auth.SessionKey) > 0 {
		errs = append(errs, errors.New("fields Console.Store, Console.Prefix and Console.Auth must be empty: each tenant's store comes from the catalog, and Prefix and Auth are FleetConfig's own"))
	}
	c.Prefix, c.Auth = cfg.Prefix, cfg.Auth
	c = c.withDefaults()
	if err := c.validateOptions(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("fleet console config: %w", err)
	}
	root, err := newHandler(c, nil)
	if err != nil {
		return nil, err
	}
	// Every tenant's console signs and reads the fleet's sessions and CSRF tokens.
	c.Auth.SessionKey = root.key
	c.Prefix = ""
	f := &fleetConsole{cfg: cfg, fc: fc, root: root, tenantCfg: c, tenants: map[string]*tenantConsole{}, open: map[*tenantConsole]bool{}}
	root.fleet = f
	root.fleetRoutes()
	return root, nil
}

// fleetConsole is what a fleet's handler keeps: the catalog last read and the tenants' consoles.
type fleetConsole struct {
	cfg       FleetConfig
	fc        store.FleetControl
	root      *Handler
	tenantCfg Config // each tenant's, but for Store and Prefix

	catMu  sync.Mutex // one catalog read at a time
	mu     sync.Mutex // guards the fields below
	cat    *catalogView
	catAt  time.Time
	catErr error

	tenants map[string]*tenantConsole // by outbox name
	open    map[*tenantConsole]bool   // every console open, retired ones included
	started bool
	ctx     context.Context // Start's, for the tenants' consoles
	stopped bool
}

// tenantConsole is one tenant's console and its store.
type tenantConsole struct {
	outbox   fleet.Outbox
	seg      string // the path segment it is served under
	ready    chan struct{}
	err      error // set before ready closes, when it could not be opened
	h        *Handler
	close    func() error
	inflight int
	used     time.Time
	retired  bool // replaced or evicted: closed once its last request ends
	once     sync.Once
}

// tenantLink tells a tenant's console which fleet it belongs to.
type tenantLink struct {
	f      *fleetConsole
	outbox fleet.Outbox
}

var errStopped = errors.New("this console has stopped")

// shut stops t's console and closes its store, once.
func (t *tenantConsole) shut(ctx context.Context) error {
	var err error
	t.once.Do(func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = t.h.Stop(sctx)
		if t.close != nil {
			err = errors.Join(err, t.close())
		}
	})
	return err
}

func (f *fleetConsole) start(ctx context.Context) error {
	f.mu.Lock()
	if f.started || f.stopped {
		f.mu.Unlock()
		return nil
	}
	f.started, f.ctx = true, context.WithoutCancel(ctx)
	var open []*tenantConsole
	for t := range f.open {
		open = append(open, t)
	}
	f.mu.Unlock()
	for _, t := range open {
		if err := t.h.Start(f.ctx); err != nil {
			return err
		}
	}
	return nil
}

func (f *fleetConsole) stop(ctx context.Context) error {
	f.mu.Lock()
	f.stopped = true
	var open []*tenantConsole
	for t := range f.open {
		open = append(open, t)
	}
	f.open, f.tenants = map[*tenantConsole]bool{}, map[string]*tenantConsole{}
	f.mu.Unlock()
	var errs []error
	for _, t := range open {
		errs = append(errs, t.shut(ctx))
	}
	return errors.Join(errs...)
}

// acquire is the console of outbox o served under seg, opened if need be; release gives it back.
func (f *fleetConsole) acquire(ctx context.Context, o fleet.Outbox, seg string) (*tenantConsole, func(), error) {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return nil, nil, errStopped
	}
	var retired *tenantConsole
	t := f.tenants[o.Name]
	if t != nil && (t.outbox != o || t.seg != seg) {
		// The catalog moved the tenant, or another outbox took its path: a new console, and the
		// old one closed once no request uses it.
		delete(f.tenants, o.Name)
		t.retired = true
		if t.inflight == 0 && f.open[t] {
			delete(f.open, t)
			retired = t
		}
		t = nil
	}
	opener := t == nil
	if opener {
		t = &tenantConsole{outbox: o, seg: seg, ready: make(chan struct{})}
		f.tenants[o.Name] = t
	}
	t.inflight++
	t.used = time.Now()
	f.mu.Unlock()
	if retired != nil {
		f.shutAll([]*tenantConsole{retired})
	}
	release := func() { f.release(t) }

	if opener {
		f.openTenant(ctx, t)
	} else {
		select {
		case <-t.ready:
		case <-ctx.Done():
			release()
			return nil, nil, ctx.Err()
		}
	}
	if t.err != nil {
		release()
		return nil, nil, t.err
	}
	return t, release, nil
}

// openTenant opens t's store and builds its console, then closes t.ready.
func (f *fleetConsole) openTenant(ctx context.Context, t *tenantConsole) {
	defer close(t.ready)
	h, closeStore, err := f.build(ctx, t.outbox, t.seg)
	f.mu.Lock()
	if err == nil && f.stopped {
		err = errStopped
	}
	if err != nil {
		t.err = err
		if f.tenants[t.outbox.Name] == t {
			delete(f.tenants, t.outbox.Name) // the next request tries again
		}
		f.mu.Unlock()
		if closeStore != nil {
			_ = closeStore()
		}
		return
	}
	t.h, t.close = h, closeStore
	f.open[t] = true
	started, sctx := f.started, f.ctx
	evict := f.evictable()
	f.mu.Unlock()
	if started {
		_ = h.Start(sctx) // it returns at once
	}
	f.shutAll(evict)
}

// build opens outbox o's store and a console on it served under seg; closeStore, when not nil,
// closes the store.
func (f *fleetConsole) build(ctx context.Context, o fleet.Outbox, seg string) (h *Handler, closeStore func() error, err error) {
	opened, err := f.cfg.Open(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	closeStore = opened.Close
	if closeStore == nil {
		closeStore = func() error { return nil }
	}
	if opened.Store == nil {
		return nil, closeStore, errors.New("FleetConfig.Open returned no store")
	}
	cfg := f.tenantCfg
	cfg.Store = opened.Store
	cfg.Prefix = f.root.cfg.Prefix + "/t/" + pathKey(seg)
	if h, err = New(cfg); err != nil {
		return nil, closeStore, err
	}
	h.tenant = &tenantLink{f: f, outbox: o}
	h.cookieRoot = f.root.cookiePath()
	h.assetRoot = f.root.cfg.Prefix
	return h, closeStore, nil
}

// shutAll shuts the consoles given, logging what fails.
func (f *fleetConsole) shutAll(ts []*tenantConsole) {
	for _, t := range ts {
		if err := t.shut(context.Background()); err != nil {
			f.root.cfg.Logger.Error("Cannot close a tenant's console", err, map[string]any{"tenant": t.outbox.Tenant})
		}
	}
}

// evictable takes the consoles past MaxOpen, used least lately, that no request is using, out of
// the fleet's maps. f.mu is held.
func (f *fleetConsole) evictable() []*tenantConsole {
	var idle []*tenantConsole
	for t := range f.open {
		if t.inflight == 0 {
			idle = append(idle, t)
		}
	}
	slices.SortFunc(idle, func(a, b *tenantConsole) int { return a.used.Compare(b.used) })
	var out []*tenantConsole
	for n := len(f.open); n > f.cfg.MaxOpen && len(idle) > 0; n-- {
		t := idle[0]
		idle = idle[1:]
		delete(f.open, t)
		if f.tenants[t.outbox.Name] == t {
			delete(f.tenants, t.outbox.Name)
		}
		out = append(out, t)
	}
	return out
}

func (f *fleetConsole) release(t *tenantConsole) {
	f.mu.Lock()
	t.inflight--
	t.used = time.Now()
	shut := t.retired && t.inflight == 0 && f.open[t]
	if shut {
		delete(f.open, t)
	}
	evict := f.evictable()
	f.mu.Unlock()
	if shut {
		evict = append(evict, t)
	}
	f.shutAll(evict)
}

// catalogView is the catalog, checked, with its outboxes found by name and by tenant.
type catalogView struct {
	outboxes []fleet.Outbox // by name, defaults filled in
	byName   map[string]int
	byTenant map[string][]int
}

func newCatalogView(outboxes []fleet.Outbox) (*catalogView, error) {
	c := &catalogView{byName: map[string]int{}, byTenant: map[string][]int{}}
	var dup []string
	for _, o := range outboxes {
		if strings.TrimSpace(o.Name) == "" {
			continue // the members refuse it too; nothing to link it by
		}
		if o.Tenant == "" {
			o.Tenant = o.Name
		}
		if o.Schema == "" {
			o.Schema = fleet.DefaultSchema
		}
		if o.Relay == "" {
			o.Relay = fleet.RelayPoll
		}
		if _, ok := c.byName[o.Name]; ok {
			dup = append(dup, o.Name)
			continue
		}
		c.byName[o.Name] = -1
		c.outboxes = append(c.outboxes, o)
	}
	if len(dup) > 0 {
		return nil, fmt.Errorf("%w: outbox names must be unique, and these appear more than once: %s",
			fleet.ErrCatalog, strings.Join(slices.Compact(slices.Sorted(slices.Values(dup))), ", "))
	}
	slices.SortFunc(c.outboxes, func(a, b fleet.Outbox) int { return strings.Compare(a.Name, b.Name) })
	for i, o := range c.outboxes {
		c.byName[o.Name] = i
		c.byTenant[o.Tenant] = append(c.byTenant[o.Tenant], i)
	}
	return c, nil
}

// resolve finds the outbox a path segment or a name typed into the switcher means: the outbox of
// that name, or else the only outbox of that tenant.
func (c *catalogView) resolve(s string) (fleet.Outbox, bool) {
	if c == nil {
		return fleet.Outbox{}, false
	}
	if i, ok := c.byName[s]; ok {
		return c.outboxes[i], true
	}
	if is := c.byTenant[s]; len(is) == 1 {
		return c.outboxes[is[0]], true
	}
	return fleet.Outbox{}, false
}

// named finds the outbox of that name.
func (c *catalogView) named(name string) (fleet.Outbox, bool) {
	if c == nil {
		return fleet.Outbox{}, false
	}
	i, ok := c.byName[name]
	if !ok {
		return fleet.Outbox{}, false
	}
	return c.outboxes[i], true
}

// segment is the name o's console is served under: its tenant, when that finds it, else its name.
func (c *catalogView) segment(o fleet.Outbox) string {
	if r, ok := c.resolve(o.Tenant); ok && r.Name == o.Name {
		return o.Tenant
	}
	return o.Name
}

// catalog is the catalog, read again once CacheTTL has passed. On a failure it returns the last
// catalog read (nil when none was) with the error.
func (f *fleetConsole) catalog(ctx context.Context) (*catalogView, error) {
	ttl := f.tenantCfg.CacheTTL
	f.mu.Lock()
	if f.cat != nil && time.Since(f.catAt) < ttl {
		c, err := f.cat, f.catErr
		f.mu.Unlock()
		return c, err
	}
	f.mu.Unlock()
	f.catMu.Lock()
	defer f.catMu.Unlock()
	f.mu.Lock()
	if f.cat != nil && time.Since(f.catAt) < ttl { // read meanwhile
		c, err := f.cat, f.catErr
		f.mu.Unlock()
		return c, err
	}
	f.mu.Unlock()
	outboxes, err := f.cfg.Catalog.Outboxes(ctx)
	var c *catalogView
	if err == nil {
		c, err = newCatalogView(outboxes)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			f.root.cfg.Logger.Error("Cannot read the fleet's catalog; the last one read stays in force", err, nil)
		}
		return f.cat, fmt.Errorf("read the fleet's catalog: %w", err)
	}
	f.cat, f.catAt, f.catErr = c, time.Now(), nil
	return c, nil
}

// lastCatalog is the catalog last read, without reading it.
func (f *fleetConsole) lastCatalog() *catalogView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cat
}

// safeSegment is a tenant's name that a path carries as it is.
var safeSegment = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._~-]*$`)

// pathKey is the path segment of a tenant's name: the name itself when it is plain, else "~" and
// the name in base64url, so that no name needs escaping in a path (nor the handlers' patterns).
func pathKey(name string) string {
	if safeSegment.MatchString(name) {
		return name
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// parseKey undoes pathKey.
func parseKey(key string) (string, bool) {
	if rest, ok := strings.CutPrefix(key, "~"); ok {
		b, err := base64.RawURLEncoding.DecodeString(rest)
		return string(b), err == nil
	}
	return key, safeSegment.MatchString(key)
}

// identityKey carries, from a fleet's handler to a tenant's console, whom it authenticated.
type identityKey struct{}

func (h *Handler) fleetRoutes() {
	p := h.cfg.Prefix
	m := h.mux
	f := h.fleet
	h.baseRoutes(f.healthz)
	m.HandleFunc("GET "+p+"/{$}", h.auth(Viewer, f.fleetPage))
	m.HandleFunc("GET "+p+"/t", h.auth(Viewer, f.switchTenant))
	m.Handle("GET "+p+"/t/{$}", http.RedirectHandler(p+"/", http.StatusSeeOther))
	m.HandleFunc(p+"/t/{tenant}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path+"/", http.StatusMovedPermanently)
	})
	// Everyone is authenticated here, once, and the tenant's console told whom: a request for a
	// tenant nobody signed in for opens no database.
	m.HandleFunc(p+"/t/{tenant}/", h.auth(Viewer, f.serveTenant))
	if p != "" {
		m.Handle("GET "+p, http.RedirectHandler(p+"/", http.StatusMovedPermanently))
	}
}

// healthz answers 200 while the coordination database answers.
func (f *fleetConsole) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if _, _, err := f.fc.FleetMembers(ctx, f.cfg.Fleet); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("coordination\n")) // no detail: the health check answers anyone
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// serveTenant hands the request to its tenant's console, opened if need be.
func (f *fleetConsole) serveTenant(w http.ResponseWriter, r *http.Request, id Identity) {
	key := r.PathValue("tenant")
	cat, err := f.catalog(r.Context())
	if cat == nil {
		f.root.failed(w, r, "read the fleet's catalog", err)
		return
	}
	name, ok := parseKey(key)
	o, found := cat.resolve(name)
	if !ok || !found {
		f.unknownTenant(w, r, id, name)
		return
	}
	seg := cat.segment(o)
	if canon := pathKey(seg); canon != key {
		// The outbox's name where its tenant finds it: one address per console.
		u := *r.URL
		u.Path = f.root.cfg.Prefix + "/t/" + canon + strings.TrimPrefix(r.URL.Path, f.root.cfg.Prefix+"/t/"+key)
		u.RawPath = ""
		http.Redirect(w, r, u.RequestURI(), http.StatusTemporaryRedirect)
		return
	}
	t, release, err := f.acquire(r.Context(), o, seg)
	if errors.Is(err, errStopped) {
		f.root.refuse(w, r, http.StatusServiceUnavailable, "This console has stopped: the tenants' pages are closed.")
		return
	}
	if err != nil {
		f.root.failed(w, r, "open the database of tenant "+o.Tenant, err)
		return
	}
	defer release()
	t.h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
}

func (f *fleetConsole) unknownTenant(w http.ResponseWriter, r *http.Request, id Identity, name string) {
	w.WriteHeader(http.StatusNotFound)
	f.root.render(w, r, "message", "Unknown tenant", "fleet", id, notice{
		Title: fmt.Sprintf("No tenant %q in fleet %s", name, f.cfg.Fleet),
		Text: fmt.Sprintf("The fleet's catalog has no tenant and no outbox named %q. Check the name, or find the tenant on the fleet page.",
			name),
		Link: f.root.cfg.Prefix + "/?q=" + url.QueryEscape(name), LinkText: "Find it on the fleet page",
	}, nil)
}

// switchPages are the pages the tenant switcher keeps when it moves to another tenant.
var switchPages = map[string]string{"overview": "/", "letters": "/letters", "jobs": "/jobs", "audit": "/audit"}

// switchTenant goes to the tenant typed into the switcher, on the page the person was on; to the
// fleet page filtered by what was typed when no tenant has that name.
func (f *fleetConsole) switchTenant(w http.ResponseWriter, r *http.Request, _ Identity) {
	p := f.root.cfg.Prefix
	name := strings.TrimSpace(r.URL.Query().Get("tenant"))
	at := "/"
	for _, page := range switchPages {
		if r.URL.Query().Get("at") == page {
			at = page
		}
	}
	cat, _ := f.catalog(r.Context())
	if o, ok := cat.resolve(name); ok {
		http.Redirect(w, r, p+"/t/"+pathKey(cat.segment(o))+at, http.StatusSeeOther)
		return
	}
	q := url.Values{"q": {name}}
	if name != "" {
		q.Set("flash", fmt.Sprintf("No tenant is named %q: the outboxes whose tenant or name contains it are listed.", name))
	}
	http.Redirect(w, r, p+"/?"+q.Encode(), http.StatusSeeOther)
}

// fleetBar is what the top bar of every page of a fleet's console shows: the fleet, the tenant,
// and the switcher.
type fleetBar struct {
	P      string // the fleet's console's prefix
	Name   string
	Tenant string // "" on the fleet's own pages
	Outbox string // the outbox, when its name is not the tenant's
	At     string // this page, kept when switching tenant
	// Tenants are what the switcher offers: every outbox's path segment, by name.
	Tenants []string
}

// maxSwitcher bounds the names the switcher offers on every page.
const maxSwitcher = 2000

func (f *fleetConsole) bar(o *fleet.Outbox, nav string) *fleetBar {
	b := &fleetBar{P: f.root.cfg.Prefix, Name: f.cfg.Fleet, At: switchPages[nav]}
	if o != nil {
		b.Tenant = o.Tenant
		if o.Name != o.Tenant {
			b.Outbox = o.Name
		}
	}
	if b.At == "" {
		b.At = "/"
	}
	if cat := f.lastCatalog(); cat != nil {
		for _, o := range cat.outboxes {
			if len(b.Tenants) == maxSwitcher {
				break
			}
			b.Tenants = append(b.Tenants, cat.segment(o))
		}
		slices.Sort(b.Tenants)
	}
	return b
}
