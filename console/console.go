// Package console is outboxkit's operator console: an http.Handler that shows what is stuck and
// fixes it from a browser, on every store. A team mounts it under a prefix of its own server,
// behind its own auth if it likes (Auth.Authenticate); `outboxctl console` runs it alone.
//
// Its pages: an overview (per topic, relay and consumer: backlog, rates, dead letters, pauses);
// the dead letters of the outbox and of each consumer, keyset-paged, filtered, and grouped by
// failure (the error with its values stripped, per event type); a letter's detail (payload as
// JSON or hex, metadata, trace id, outbound key); jobs; and the audit of every action.
//
// Its actions, for the operator role only, each a POST carrying a CSRF token and recorded in the
// audit: replay or archive the selected letters, or every letter of a filter or a failure group
// (a preview first, then a job that runs at a set rate, in each key's order, cancellable and
// resumable by any console); pause and resume a topic or a relay (relays honour it within a
// pass). Nothing is ever deleted by an action.
//
// A relay fleet (package fleet) has a console of its own, NewFleet: a page for the fleet — its
// members, and its outboxes, those without an owner first — and under it, for each tenant of the
// fleet's catalog, every page above on that tenant's store, behind one sign-in.
//
// Reads are bounded: lists are keyset-paged, a filter no index serves reads a bounded number of
// letters and says so, counts are capped, and the heavy figures are cached, so a page costs the
// same at a million letters as at ten.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

//go:embed templates/*.tmpl static/*
var assets embed.FS

// Defaults for Config fields left at their zero value.
const (
	DefaultRate            = 100
	DefaultMaxRate         = 1000
	DefaultJobLease        = 30 * time.Second
	DefaultBackpressure    = 2000
	DefaultPageSize        = 50
	DefaultScanLimit       = 20000
	DefaultCountCap        = 10000
	DefaultBacklogHeadRows = 100000
	DefaultCacheTTL        = 10 * time.Second
	DefaultChartInterval   = 20 * time.Second
	// PayloadShown is how much of a payload a detail page shows; the rest is downloadable.
	PayloadShown = 64 << 10
)

// LagFunc reads a consumer group's backlog in the broker (backends.Backend.Lag fits).
type LagFunc func(ctx context.Context, topic, consumer string) (Lag, error)

// Lag is a consumer group's backlog in the broker.
type Lag struct {
	Waiting    int64
	Unacked    int64
	HasUnacked bool
	OldestAge  time.Duration
	HasAge     bool
}

// Config configures a Handler. Zero values take the documented defaults; New names a bad field.
type Config struct {
	// Store is the database: a store.Store whose driver implements store.Console (every driver in
	// this module does). Required.
	Store store.Store
	// Prefix is the path the handler is mounted at, e.g. "/console". Mount it WITHOUT
	// http.StripPrefix: the handler reads full paths and writes every link, asset, form and
	// cookie path under Prefix. Default "" (the root).
	Prefix string
	// Auth says who may look and who may act. New refuses a handler with no way in.
	Auth Auth

	// Publisher sends consumers' dead letters back to their topics when they are replayed.
	// Default nil: consumers' replays are refused with the reason (archive still works); the
	// outbox's letters need none (the relay publishes them).
	Publisher message.Publisher
	// Lag reads each consumer's backlog in the broker for the overview. Default nil: "n/a".
	Lag LagFunc
	// Consumers names the topics each consumer reads, for the overview. Default: the consumers
	// the tables name, without their topics.
	Consumers map[string][]string

	// HidePayloads keeps payloads out of every page and download (personal data). Default false.
	HidePayloads bool
	// RedactMetadata are metadata keys whose values are shown as "redacted". Default none.
	RedactMetadata []string
	// Environment is shown in the top bar ("production" in red, anything else in amber).
	Environment string
	// TraceURL links a letter's trace id: "{trace_id}" is replaced. Default: no link.
	TraceURL string

	// DisableJobs stops this handler from running jobs (another console runs them). Default false.
	DisableJobs bool
	// DefaultRate is the rate a job's form offers first, in letters a second. Default 100.
	DefaultRate int
	// MaxRate is the most a job may ask. Default 1000.
	MaxRate int
	// JobLease is how long a job is this console's without renewal. Default 30s.
	JobLease time.Duration
	// Backpressure holds an outbox replay while the relay has more than this many rows pending
	// (its own replayed rows included, paused topics not), so a large replay never starves live
	// traffic. Default 2000; negative: off.
	Backpressure int

	// PageSize is letters per page. Default 50, at most 200.
	PageSize int
	// ScanLimit is how many letters a filter no index serves (topic, event type, error text)
	// reads per page. Default 20,000.
	ScanLimit int
	// CountCap is the most a count on a page counts; above, "10,000+". Default 10,000.
	CountCap int
	// BacklogHeadRows is how many of the oldest pending rows the overview's per-topic figures
	// read. Default 100,000.
	BacklogHeadRows int
	// CacheTTL is how long the overview's figures and the failure groups are kept. Default 10s.
	CacheTTL time.Duration
	// ChartInterval is how often the overview's charts take a sample of its figures (those
	// CacheTTL keeps: the charts run no query of their own). They keep the last hour, in memory,
	// so a console started a minute ago charts a minute. Default 20s, at most 5m; negative: no
	// charts.
	ChartInterval time.Duration

	// Logger receives the console's logs; it never receives tokens, cookies or payloads.
	// Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Handler serves the console. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	db    store.Store
	con   store.Console
	mux   *http.ServeMux
	pages map[string]*template.Template
	css   string // hashed asset names
	js    string
	files map[string]staticFile
	cop   *http.CrossOriginProtection
	key   []byte // signs sessions and CSRF tokens
	owner string // names this console's job leases

	cache   *cache
	history *history // the charts' samples

	// A console of a fleet (NewFleet): fleet is set on the fleet's own handler, which serves the
	// fleet page and each tenant's console; tenant on each tenant's console. cookieRoot is the
	// path of the cookies one sign-in shares across the fleet's pages, assetRoot where the
	// stylesheet and script are served; both default to Prefix.
	fleet      *fleetConsole
	tenant     *tenantLink
	cookieRoot string
	assetRoot  string

	mu      sync.Mutex
	started bool
	stop    context.CancelFunc
	done    chan struct{}
	wake    chan struct{}
}

// New validates cfg and builds the handler. It does not touch the database.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.withDefaults()
	con, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("console config: %w", err)
	}
	h, err := newHandler(cfg, con)
	if err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

// newHandler builds what every handler has — assets, templates, keys — on con, which is nil for
// a fleet's own handler; the caller adds the routes.
func newHandler(cfg Config, con store.Console) (*Handler, error) {
	h := &Handler{cfg: cfg, db: cfg.Store, con: con, mux: http.NewServeMux(), pages: map[string]*template.Template{},
		files: map[string]staticFile{}, cop: http.NewCrossOriginProtection(), key: cfg.Auth.SessionKey, wake: make(chan struct{}, 1)}
	if len(h.key) == 0 {
		h.key = make([]byte, 32)
		if _, err := rand.Read(h.key); err != nil {
			return nil, err
		}
	}
	host, _ := os.Hostname()
	h.owner = fmt.Sprintf("console@%s (pid %d) %s", host, os.Getpid(), randomID()[:6])
	h.cache = newCache(h)
	h.history = newHistory(cfg.ChartInterval)
	if err := h.loadAssets(); err != nil {
		return nil, err
	}
	return h, nil
}

func (c Config) withDefaults() Config {
	c.Prefix = strings.TrimSuffix(c.Prefix, "/")
	if c.DefaultRate == 0 {
		c.DefaultRate = DefaultRate
	}
	if c.MaxRate == 0 {
		c.MaxRate = DefaultMaxRate
	}
	if c.JobLease == 0 {
		c.JobLease = DefaultJobLease
	}
	if c.Backpressure == 0 {
		c.Backpressure = DefaultBackpressure
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.ScanLimit == 0 {
		c.ScanLimit = DefaultScanLimit
	}
	if c.CountCap == 0 {
		c.CountCap = DefaultCountCap
	}
	if c.BacklogHeadRows == 0 {
		c.BacklogHeadRows = DefaultBacklogHeadRows
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.ChartInterval == 0 {
		c.ChartInterval = DefaultChartInterval
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Auth.LocalRole == 0 {
		c.Auth.LocalRole = Operator
	}
	return c
}

func (c Config) validate() (store.Console, error) {
	var errs []error
	var con store.Console
	if c.Store == nil {
		errs = append(errs, errors.New("field Store is required: pass the store of the database holding outboxkit's tables"))
	} else if s, ok := store.ConsoleOf(c.Store); ok {
		con = s
	} else {
		errs = append(errs, fmt.Errorf("field Store: %T does not implement store.Console (every driver of this module does)", c.Store))
	}
	return con, errors.Join(append(errs, c.validateOptions())...)
}

// validateOptions checks every field but Store.
func (c Config) validateOptions() error {
	var errs []error
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, "?#{} ")) {
		errs = append(errs, fmt.Errorf("field Prefix %q must be a path starting with / (e.g. /console)", c.Prefix))
	}
	if err := c.Auth.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DefaultRate < 1 || c.MaxRate < c.DefaultRate {
		errs = append(errs, fmt.Errorf("fields DefaultRate (%d) and MaxRate (%d) must be positive, DefaultRate at most MaxRate", c.DefaultRate, c.MaxRate))
	}
	if c.PageSize < 1 || c.PageSize > 200 {
		errs = append(errs, fmt.Errorf("field PageSize must be within 1..200, got %d", c.PageSize))
	}
	if c.ScanLimit < c.PageSize || c.CountCap < 1 || c.BacklogHeadRows < 1 || c.CacheTTL < 0 || c.JobLease < time.Second {
		errs = append(errs, errors.New("fields ScanLimit (at least PageSize), CountCap, BacklogHeadRows (positive), CacheTTL and JobLease (at least 1s) are out of range"))
	}
	if c.ChartInterval > 5*time.Minute {
		errs = append(errs, fmt.Errorf("field ChartInterval must be at most 5m (an hour of at least 12 samples), or negative for no charts; got %s", c.ChartInterval))
	}
	return errors.Join(errs...)
}

// Start starts the job runner (unless DisableJobs), the regrouping of letters stored before the
// console's migration, and the charts' sampling. It returns at once; calling it again does nothing. Stop ends them. On a
// fleet's console (NewFleet) it starts each tenant's console as it is opened.
func (h *Handler) Start(ctx context.Context) error {
	if h.fleet != nil {
		return h.fleet.start(ctx)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started {
		return nil
	}
	h.started = true
	ctx, h.stop = context.WithCancel(context.WithoutCancel(ctx))
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		h.background(ctx)
	}()
	return nil
}

// Stop stops what Start started and waits for it: no goroutine of the handler outlives it. A job
// in progress keeps its state; its lease runs out and any console resumes it. Calling Stop before
// Start, or twice, is fine. On a fleet's console it stops every tenant's console and closes their
// stores, and the tenants' pages are refused from then on.
func (h *Handler) Stop(ctx context.Context) error {
	if h.fleet != nil {
		return h.fleet.stop(ctx)
	}
	h.mu.Lock()
	stop, done := h.stop, h.done
	h.stop = nil
	h.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// background regroups letters stored without a failure group, keeps the figures warm, samples
// them for the charts, and runs jobs, until ctx ends.
func (h *Handler) background(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		h.regroupLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		h.cache.keepWarm(ctx)
	}()
	if h.history.every > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.history.run(ctx, h.cache)
		}()
	}
	if !h.cfg.DisableJobs {
		h.runJobs(ctx)
	}
	wg.Wait()
}

// regroupLoop fills the failure group of letters stored without one (before the console's
// migration, or by a writer that does not group), a thousand at a time.
func (h *Handler) regroupLoop(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		for {
			n, err := h.con.Regroup(ctx, 1000)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, store.ErrNotMigrated) {
					h.cfg.Logger.Error("Cannot regroup dead letters; retrying in a minute", err, nil)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ServeHTTP serves the console. Every POST must come from the console's own origin
// (http.CrossOriginProtection) and carry the form's CSRF token; bearer-token calls, which no
// other site can make, need only the first.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Content-Type-Options", "nosniff")
	p := r.URL.Path
	if p != h.cfg.Prefix && !strings.HasPrefix(p, h.cfg.Prefix+"/") {
		http.Error(w, fmt.Sprintf("not found: this console is mounted at %s/", h.cfg.Prefix), http.StatusNotFound)
		return
	}
	if r.Method == http.MethodPost {
		if err := h.cop.Check(r); err != nil {
			h.refuse(w, r, http.StatusForbidden, "Refused: this form was posted from another site ("+err.Error()+").")
			return
		}
		if !h.bearer(r) && !h.validCSRF(r) {
			h.refuse(w, r, http.StatusForbidden, "Refused: the form's security token is missing or out of date. Reload the page and try again.")
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}
