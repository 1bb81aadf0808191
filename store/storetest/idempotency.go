package storetest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/idempotency"
)

func idempotencyTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"RetryReturnsTheFirstResponse", idemRetry[TTx]},
		{"SameKeyDifferentBodyIs422", idemDifferentBody[TTx]},
		{"ConcurrentRetriesRunTheHandlerOnce", idemConcurrent[TTx]},
		{"ServerErrorsAreNotRecordedAndRollBackTheWrites", idemServerError[TTx]},
		{"KeyRequiredOrNot", idemRequired[TTx]},
	}
}

// idemServer counts handler runs and, with a key, writes an order row in the key's transaction.
func idemServer[TTx any](t *testing.T, h Harness[TTx], required bool, status func(body string) int) (*httptest.Server, *Env[TTx], *atomic.Int32) {
	t.Helper()
	e := migrated(t, h)
	e.MustExec(t, `CREATE TABLE {{schema}}.orders (body VARCHAR(255))`)
	var runs atomic.Int32
	mw, err := idempotency.Middleware(idempotency.Config{Store: e.Store, Required: required})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		tx, ok, err := outboxkit.TxFrom[TTx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if ok {
			if err := e.ExecTx(r.Context(), tx, `INSERT INTO {{schema}}.orders (body) VALUES (?)`, string(body)); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status(string(body)))
		fmt.Fprintf(w, `{"run":%d}`, n)
	})))
	t.Cleanup(srv.Close)
	return srv, e, &runs
}

func idemPost(t *testing.T, srv *httptest.Server, key, body string) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
	if key != "" {
		req.Header.Set(idempotency.Header, key)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), idempotency.Replayed(resp)
}

func created(string) int { return http.StatusCreated }

func idemRetry[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	srv, e, runs := idemServer(t, h, false, created)
	code1, body1, replayed1 := idemPost(t, srv, "k-1", `{"total":10}`)
	code2, body2, replayed2 := idemPost(t, srv, "k-1", `{"total":10}`)
	if code1 != 201 || code2 != 201 || body1 != body2 || replayed1 || !replayed2 {
		t.Fatalf("first %d %s (replayed %v), retry %d %s (replayed %v); want the same 201 body, the retry marked replayed",
			code1, body1, replayed1, code2, body2, replayed2)
	}
	if runs.Load() != 1 || e.MustInt(t, `SELECT count(*) FROM {{schema}}.orders`) != 1 {
		t.Fatalf("handler ran %d times; want once, one order", runs.Load())
	}
	// A new key is a new operation.
	if code, _, replayed := idemPost(t, srv, "k-2", `{"total":10}`); code != 201 || replayed || runs.Load() != 2 {
		t.Fatalf("new key: %d, replayed %v, runs %d", code, replayed, runs.Load())
	}
}

func idemDifferentBody[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	srv, _, runs := idemServer(t, h, false, created)
	idemPost(t, srv, "k-1", `{"total":10}`)
	code, body, _ := idemPost(t, srv, "k-1", `{"total":99}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "different request body") || runs.Load() != 1 {
		t.Fatalf("got %d %s after %d runs; want 422 explaining the key was used with another body", code, body, runs.Load())
	}
}

func idemConcurrent[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	srv, e, runs := idemServer(t, h, false, created)
	var wg sync.WaitGroup
	bodies := make([]string, h.sessions(t, 20))
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, _ := idemPost(t, srv, "same", `{"total":10}`)
			if code != 201 {
				t.Errorf("concurrent retry got %d %s", code, body)
			}
			bodies[i] = body
		}()
	}
	wg.Wait()
	if runs.Load() != 1 || e.MustInt(t, `SELECT count(*) FROM {{schema}}.orders`) != 1 {
		t.Fatalf("handler ran %d times for %d concurrent requests with one key", runs.Load(), len(bodies))
	}
	for _, b := range bodies {
		if b != bodies[0] {
			t.Fatalf("responses differ: %q vs %q", b, bodies[0])
		}
	}
}

func idemServerError[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	var fail atomic.Bool
	fail.Store(true)
	srv, e, runs := idemServer(t, h, false, func(string) int {
		if fail.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusCreated
	})
	if code, _, _ := idemPost(t, srv, "k-1", `{}`); code != 500 {
		t.Fatalf("got %d", code)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.orders`); n != 0 {
		t.Fatalf("the failed request's order survived (%d rows): it must roll back with the key", n)
	}
	fail.Store(false)
	if code, _, replayed := idemPost(t, srv, "k-1", `{}`); code != 201 || replayed || runs.Load() != 2 {
		t.Fatalf("retry after a 500: %d replayed %v runs %d; want the handler to run again", code, replayed, runs.Load())
	}
}

func idemRequired[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	srv, _, runs := idemServer(t, h, true, created)
	if code, body, _ := idemPost(t, srv, "", `{}`); code != 400 || !strings.Contains(body, "Idempotency-Key header is required") || runs.Load() != 0 {
		t.Fatalf("required: got %d %s", code, body)
	}
	free, _, freeRuns := idemServer(t, h, false, created)
	idemPost(t, free, "", `{}`)
	idemPost(t, free, "", `{}`)
	if freeRuns.Load() != 2 {
		t.Fatalf("without a key each request runs: %d runs", freeRuns.Load())
	}
}
