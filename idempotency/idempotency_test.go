package idempotency_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// server counts handler runs and, with a key, writes an order row in the key's transaction.
func server(t *testing.T, required bool, status func(body string) int) (*httptest.Server, *testenv.PG, *atomic.Int32) {
	t.Helper()
	pg := testenv.NewPG(t)
	pg.Exec(t, `CREATE TABLE {{schema}}.orders (id serial PRIMARY KEY, body text)`)
	var runs atomic.Int32
	mw, err := idempotency.Middleware(idempotency.Config{Pool: pg.Pool, Schema: string(pg.Schema), Required: required})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		var id int
		if tx, ok := idempotency.TxFrom(r.Context()); ok {
			if err := tx.QueryRow(r.Context(), pg.Schema.Render(`INSERT INTO {{schema}}.orders (body) VALUES ($1) RETURNING id`), string(body)).Scan(&id); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status(string(body)))
		fmt.Fprintf(w, `{"order":%d,"run":%d}`, id, n)
	})))
	t.Cleanup(srv.Close)
	return srv, pg, &runs
}

func post(t *testing.T, srv *httptest.Server, key, body string) (int, string, bool) {
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

func TestRetryReturnsTheFirstResponse(t *testing.T) {
	t.Parallel()
	srv, pg, runs := server(t, false, created)
	code1, body1, replayed1 := post(t, srv, "k-1", `{"total":10}`)
	code2, body2, replayed2 := post(t, srv, "k-1", `{"total":10}`)
	if code1 != 201 || code2 != 201 || body1 != body2 || replayed1 || !replayed2 {
		t.Fatalf("first %d %s (replayed %v), retry %d %s (replayed %v); want the same 201 body, the retry marked replayed",
			code1, body1, replayed1, code2, body2, replayed2)
	}
	if runs.Load() != 1 || pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`) != 1 {
		t.Fatalf("handler ran %d times; want once, one order", runs.Load())
	}
	// A new key is a new operation.
	if code, _, replayed := post(t, srv, "k-2", `{"total":10}`); code != 201 || replayed || runs.Load() != 2 {
		t.Fatalf("new key: %d, replayed %v, runs %d", code, replayed, runs.Load())
	}
}

func TestSameKeyDifferentBodyIs422(t *testing.T) {
	t.Parallel()
	srv, _, runs := server(t, false, created)
	post(t, srv, "k-1", `{"total":10}`)
	code, body, _ := post(t, srv, "k-1", `{"total":99}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "different request body") || runs.Load() != 1 {
		t.Fatalf("got %d %s after %d runs; want 422 explaining the key was used with another body", code, body, runs.Load())
	}
}

func TestConcurrentRetriesRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	srv, pg, runs := server(t, false, created)
	var wg sync.WaitGroup
	bodies := make([]string, 20)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, _ := post(t, srv, "same", `{"total":10}`)
			if code != 201 {
				t.Errorf("concurrent retry got %d %s", code, body)
			}
			bodies[i] = body
		}()
	}
	wg.Wait()
	if runs.Load() != 1 || pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`) != 1 {
		t.Fatalf("handler ran %d times for 20 concurrent requests with one key", runs.Load())
	}
	for _, b := range bodies {
		if b != bodies[0] {
			t.Fatalf("responses differ: %q vs %q", b, bodies[0])
		}
	}
}

func TestServerErrorsAreNotRecordedAndRollBackTheWrites(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	fail.Store(true)
	srv, pg, runs := server(t, false, func(string) int {
		if fail.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusCreated
	})
	if code, _, _ := post(t, srv, "k-1", `{}`); code != 500 {
		t.Fatalf("got %d", code)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`); n != 0 {
		t.Fatalf("the failed request's order survived (%d rows): it must roll back with the key", n)
	}
	fail.Store(false)
	if code, _, replayed := post(t, srv, "k-1", `{}`); code != 201 || replayed || runs.Load() != 2 {
		t.Fatalf("retry after a 500: %d replayed %v runs %d; want the handler to run again", code, replayed, runs.Load())
	}
}

func TestKeyRequiredOrNot(t *testing.T) {
	t.Parallel()
	srv, _, runs := server(t, true, created)
	if code, body, _ := post(t, srv, "", `{}`); code != 400 || !strings.Contains(body, "Idempotency-Key header is required") || runs.Load() != 0 {
		t.Fatalf("required: got %d %s", code, body)
	}
	free, _, freeRuns := server(t, false, created)
	post(t, free, "", `{}`)
	post(t, free, "", `{}`)
	if freeRuns.Load() != 2 {
		t.Fatalf("without a key each request runs: %d runs", freeRuns.Load())
	}

}

// When the key's record cannot be committed, the client must not be told the operation succeeded,
// nor that nothing happened (a lost commit reply can hide a commit): it is told the outcome is
// unknown and to retry with the same key. Here the commit really failed: nothing survives, and the
// retry runs the operation.
func TestFailedCommitIsReportedAndKeepsNothing(t *testing.T) {
	t.Parallel()
	srv, pg, _ := server(t, false, created)
	pg.Exec(t, `CREATE FUNCTION {{schema}}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.key = 'fail-at-commit' THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NEW; END $$`)
	pg.Exec(t, `CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON {{schema}}.idempotency_keys
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{schema}}.refuse()`)
	code, body, _ := post(t, srv, "fail-at-commit", `{}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "outcome is unknown") || !strings.Contains(body, "retry with the same") {
		t.Fatalf("got %d %s; want 503 saying the outcome is unknown and to retry with the same key", code, body)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`); n != 0 {
		t.Fatalf("%d orders survived a failed commit", n)
	}
}
