// Package idempotency is net/http middleware that makes a retried request return the first
// response instead of acting twice, keyed by the client's Idempotency-Key header.
//
// The key's record is written in a database transaction that the handler is given
// (outboxkit.TxFrom, in the store driver's transaction type): when the handler makes its writes
// in it — the order and its outbox row, say — the writes and the recorded response commit
// together, or neither does. A retry with the same key and body gets the recorded response; one
// that arrives while the first is still running waits for it (the record's row is locked); the same
// key with a different body is refused with 422. Responses with a 5xx status are not recorded: the
// transaction rolls back and a retry runs the handler again.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// Header is the request header carrying the key.
const Header = "Idempotency-Key"

// DefaultMaxBodyBytes bounds the request body read to hash it.
const DefaultMaxBodyBytes = 1 << 20

// Config configures Middleware.
type Config struct {
	// Store holds idempotency_keys (created by pipeline.Migrate). Required.
	Store store.Store
	// Required refuses requests without the header with 400. Default false: they pass through
	// without protection.
	Required bool
	// MaxBodyBytes bounds the request body read to hash it. Default DefaultMaxBodyBytes (1 MiB);
	// larger bodies get 413.
	MaxBodyBytes int64
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives a line for each request the database kept from being served. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

func (c Config) withDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("field Store is required: pass the store of the database the handler writes to"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("field MaxBodyBytes must be positive, got %d", c.MaxBodyBytes))
	}
	return errors.Join(errs...)
}

// Replayed reports whether resp is a recorded response sent again (the header Idempotent-Replayed).
func Replayed(resp *http.Response) bool { return resp.Header.Get("Idempotent-Replayed") == "true" }

// Middleware returns the middleware. See the package documentation for what it guarantees.
func Middleware(cfg Config) (func(http.Handler) http.Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	m := &middleware{cfg: cfg}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}, nil
}

type middleware struct{ cfg Config }

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(Header)
	if key == "" {
		if m.cfg.Required {
			problem(w, http.StatusBadRequest, "the "+Header+" header is required: send a unique key per operation "+
				"(a UUID) and the same key when you retry it")
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	if len(key) > 255 {
		problem(w, http.StatusBadRequest, Header+" is longer than 255 characters")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "cannot read the request body: "+err.Error())
		return
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", m.cfg.MaxBodyBytes))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	sum := sha256.Sum256(body)
	scope := r.Method + " " + r.URL.Path
	ctx := r.Context()

	tx, err := m.cfg.Store.BeginIdempotency(ctx)
	if err != nil {
		m.unavailable(w, "begin the key's transaction", key, err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// A retry racing the first request blocks here until the first commits or rolls back.
	claimed, err := tx.ClaimKey(ctx, scope, key, sum[:], m.cfg.Now())
	if err != nil {
		m.unavailable(w, "record the key", key, err)
		return
	}
	if !claimed {
		_ = tx.Rollback(ctx)
		m.replay(w, r, scope, key, sum[:])
		return
	}

	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	next.ServeHTTP(rec, r.WithContext(outboxkit.WithTx(ctx, tx.User())))
	if rec.status >= 500 {
		_ = tx.Rollback(ctx) // not recorded: a retry runs the handler again
		rec.flush(w, false)
		return
	}
	headers, _ := json.Marshal(rec.header)
	err = tx.RecordResponse(ctx, scope, key, store.IdempotencyRecord{Status: rec.status, Headers: headers, Body: rec.body.Bytes()})
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		m.cfg.Logger.Error("idempotency: recording the response failed; the outcome is unknown", err,
			watermill.LogFields{"key": key, "scope": scope})
		// A failed COMMIT may still have committed (its reply lost with the connection): the
		// outcome is unknown, not "nothing happened". A retry with the same key tells: it gets
		// the recorded response if the operation was kept, and runs it once if it was not.
		problem(w, http.StatusServiceUnavailable, "the operation's outcome is unknown: recording its response "+
			"failed or its confirmation was lost ("+err.Error()+"); retry with the same "+Header+
			": you get the first response if it was kept, and it runs once if it was not")
		return
	}
	rec.flush(w, false)
}

func (m *middleware) replay(w http.ResponseWriter, r *http.Request, scope, key string, sum []byte) {
	rec, err := m.cfg.Store.IdempotencyRecord(r.Context(), scope, key)
	if err != nil {
		m.unavailable(w, "read the key's recorded response", key, err)
		return
	}
	if !bytes.Equal(rec.RequestHash, sum) {
		problem(w, http.StatusUnprocessableEntity, "this "+Header+" was already used with a different request body: "+
			"use a new key for a new operation, or resend exactly the first body to get its response")
		return
	}
	out := &recorder{header: http.Header{}, status: rec.Status}
	_ = json.Unmarshal(rec.Headers, &out.header)
	out.body.Write(rec.Body)
	out.flush(w, true)
}

// recorder captures the handler's response so it can be stored before it is sent.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) flush(w http.ResponseWriter, replayed bool) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "title": http.StatusText(status), "detail": detail})
}

// unavailable answers 503 for a request the database kept from being served: nothing was done, and
// a retry with the same key is safe.
func (m *middleware) unavailable(w http.ResponseWriter, step, key string, err error) {
	m.cfg.Logger.Error("idempotency: could not "+step, err, watermill.LogFields{"key": key})
	reason := "the database is unavailable"
	if !m.cfg.Store.IsUnreachable(err) {
		reason = "the database refused to " + step
	}
	problem(w, http.StatusServiceUnavailable, reason+": nothing was done; retry with the same key")
}
