package pgxstore_test

// What only the Postgres stores do: NOTIFY at commit, the LISTEN connection's recovery, the claim
// statement's plan, schema names, and a deferred failure at commit.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// publish writes n events of key in a transaction of their own.
func publish(t *testing.T, pg *testenv.PG, s *pgxstore.Store, key string, n int) []*message.Message {
	t.Helper()
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	pub, err := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, pipeline.NewEvent("Happened", key, []byte(fmt.Sprintf(`{"n":%d}`, i))))
	}
	if err := pub.Publish("events", msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// recorder is a publisher that reports each message it is given.
type recorder struct{ sent chan string }

func (r recorder) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		r.sent <- m.UUID
	}
	return nil
}
func (recorder) Close() error { return nil }

func expectPublished(t *testing.T, r recorder, uuid string, within time.Duration, why string) {
	t.Helper()
	select {
	case got := <-r.sent:
		if got != uuid {
			t.Fatalf("published %s, want %s", got, uuid)
		}
	case <-time.After(within):
		t.Fatalf("not published within %s: %s", within, why)
	}
}

// listenForWakeUps listens on the schema's wake-up channel; notified(d) reports whether a
// notification arrived within d.
func listenForWakeUps(t *testing.T, pg *testenv.PG) (notified func(d time.Duration) bool) {
	t.Helper()
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	if _, err := listener.Exec(ctx, `LISTEN "`+string(pg.Schema)+`_outbox"`); err != nil {
		t.Fatal(err)
	}
	return func(d time.Duration) bool {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := listener.WaitForNotification(ctx)
		return err == nil
	}
}

func TestNotifiesOnCommitOnly(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	ctx := context.Background()
	notified := listenForWakeUps(t, pg)
	publishIn := func(commit bool) {
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := pipeline.NewPublisher(pg.Store, tx, pipeline.PublisherConfig{})
		if err := pub.Publish("orders", pipeline.NewEvent("E", "k", nil), pipeline.NewEvent("E", "k", nil)); err != nil {
			t.Fatal(err)
		}
		if notified(200 * time.Millisecond) {
			t.Fatal("notification arrived before commit")
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	publishIn(false)
	if notified(500 * time.Millisecond) {
		t.Fatal("a rolled-back publish woke the relay")
	}
	publishIn(true)
	if !notified(10 * time.Second) {
		t.Fatal("no notification after commit")
	}
}

func TestDisableNotifySendsNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	quiet, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN "`+string(pg.Schema)+`_outbox"`); err != nil {
		t.Fatal(err)
	}
	publish(t, pg, quiet, "k", 2)
	publish(t, pg, pg.Store, "k", 1) // a notifying writer after it: its notification is the first
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := listener.WaitForNotification(wctx); err != nil {
		t.Fatalf("the notifying writer's notification did not arrive: %v", err)
	}
	nctx, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if n, err := listener.WaitForNotification(nctx); err == nil {
		t.Fatalf("a second notification %+v arrived: the writer with DisableNotify notified", n)
	}
}

func TestRejectsBadSchemaNames(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pgxstore.New(nil, pgxstore.Config{}); err == nil || !strings.Contains(err.Error(), "pool is nil") {
		t.Errorf("nil pool: got %v, want an error saying so", err)
	}
	for _, name := range []string{"Outbox", "1abc", "a-b", `x"; DROP TABLE y; --`, strings.Repeat("a", 51)} {
		if _, err := pgxstore.New(pool, pgxstore.Config{Schema: name}); err == nil || !strings.Contains(err.Error(), "lowercase letters") {
			t.Errorf("schema %q: got %v, want a message saying which names are usable", name, err)
		}
	}
}

// relayWithNamedPool runs a forwarder whose sessions carry a unique application_name, so a test can
// kill exactly them. PollInterval is an hour: only NOTIFY, a reconnect or an error retry wakes it.
func relayWithNamedPool(t *testing.T, pg *testenv.PG) (recorder, string) {
	t.Helper()
	app := testenv.UniqueName(t, "fwd")
	poolCfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgxstore.New(pool, pgxstore.Config{Schema: string(pg.Schema), ListenRetry: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := recorder{sent: make(chan string, 10)}
	f, err := forwarder.New(forwarder.Config{
		Store: s, Publisher: rec, PollInterval: time.Hour,
		CircuitBackoff: forwarder.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunForwarder(t, f)
	return rec, app
}

func kill(t *testing.T, pg *testenv.PG, applicationName string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a session named "+applicationName+" to kill", func() bool {
		return pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, applicationName) > 0
	})
	var killed []int32
	rows, err := pg.Pool.Query(context.Background(),
		// The call sits in the select list so it runs only for rows the WHERE clause kept.
		`SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, applicationName)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid int32
		var signalled bool
		_ = rows.Scan(&pid, &signalled)
		killed = append(killed, pid)
	}
	rows.Close()
	// pg_terminate_backend only signals; wait until those sessions are really gone (the relay may
	// already have opened new ones under the same name).
	testenv.Eventually(t, 10*time.Second, "killed sessions to exit", func() bool {
		return pg.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, killed) == 0
	})
}

// A commit whose NOTIFY is lost while the LISTEN connection is down is still relayed when the
// connection comes back, long before the hour-long poll.
func TestRecoversNotificationsLostWhileTheListenerWasDown(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	rec, app := relayWithNamedPool(t, pg)
	kill(t, pg, app+"-listen")
	msg := publish(t, pg, pg.Store, "k", 1)[0] // its NOTIFY finds nobody listening
	expectPublished(t, rec, msg.UUID, 15*time.Second, "the reconnected listener did not trigger a pass")
}

// Killing the relay's pool sessions makes its next pass fail; Run logs, backs off and carries on.
func TestSurvivesKilledPoolSessions(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	rec, app := relayWithNamedPool(t, pg)
	kill(t, pg, app)
	msg := publish(t, pg, pg.Store, "k", 1)[0]
	expectPublished(t, rec, msg.UUID, 15*time.Second, "the relay did not recover from killed sessions")
	msg = publish(t, pg, pg.Store, "k", 1)[0]
	expectPublished(t, rec, msg.UUID, 15*time.Second, "the relay stopped after recovering")
}

// Every statement the relay and the operator run on the outbox must stay on the indexes it was
// built for, on a table Postgres has no statistics for (a fresh burst of rows) and on an analysed
// one, under custom and generic plans (the relay's statements are prepared): a sequential scan
// would make a pass cost the history behind it. The claim's per-key gap probe in particular must be
// one range scan of the pending index bounded by the window (probing the pending index once per key
// read the whole backlog per key: 0.7–1.5 s a pass at 20,000 pending rows, measured). A plan test
// rather than a timed one: the plan is what decides.
func TestOutboxPlansStayOnTheirIndexes(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile("../internal/pg/sql/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	filter := read("dead_letter_filter.sql")
	now := fmt.Sprintf("'%s'::timestamptz", time.Now().UTC().Format(time.RFC3339Nano))
	statements := []struct{ name, sql, args string }{
		{"claim", read("claim.sql"), now + ", 500, false, ''"},
		{"claim, parking", read("claim.sql"), now + ", 500, true, ''"},
		{"mark published", read("mark_published.sql"), now + ", '{1,2,3}'::bigint[]"},
		{"mark failed", read("mark_failed.sql"), `'[{"seq":1,"last_error":"x","next_attempt_at":null,"dead_lettered_at":null}]'::json`},
		{"delete on publish", read("delete_published.sql"), "'{1,2,3}'::bigint[]"},
		{"retention", read("prune_published.sql"), now + ", 1000"},
		{"stats", read("outbox_stats.sql"), ""},
		{"dead letters", strings.ReplaceAll(read("outbox_dead_letters.sql"), "{{dead_letter_filter}}", filter),
			"'{}'::bigint[], '{}'::text[], '', '', '', NULL, NULL, 100"},
		{"replay", read("replay_outbox.sql"), "'{1,2,3}'::bigint[]"},
	}
	for _, keyed := range []string{"one event per key", "100 events per key"} {
		t.Run(keyed, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			quiet, err := pgxstore.New(pg.Pool, pgxstore.Config{Schema: string(pg.Schema), DisableNotify: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			// History, as in production the bulk of the table: 200,000 published rows.
			pg.Exec(t, `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, published_at)
				SELECT gen_random_uuid(), 'orders', 'order-' || (i % 200), '\x00', now() FROM generate_series(1, 200000) AS i`)
			// Then the backlog: 4,000 rows, through the publisher, a few dead letters among them.
			for start := 0; start < 4000; start += 1000 {
				tx, err := pg.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				pub, _ := pipeline.NewPublisher(quiet, tx, pipeline.PublisherConfig{})
				var msgs []*message.Message
				for i := start; i < start+1000; i++ {
					key := fmt.Sprintf("order-%05d", i)
					if keyed != "one event per key" {
						key = fmt.Sprintf("order-%05d", i%200)
					}
					payload := fmt.Sprintf(`{"order_id":%q,"n":%d,"customer":"customer-%d","total_cents":%d}`, key, i, i%97, i*7)
					msgs = append(msgs, pipeline.NewEvent("OrderPlaced", key, []byte(payload)))
				}
				if err := pub.Publish("orders", msgs...); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			pg.Exec(t, `UPDATE {{schema}}.outbox SET dead_lettered_at = now(), attempts = 10
				WHERE published_at IS NULL AND seq % 97 = 0`)
			for _, analysed := range []bool{false, true} {
				if analysed {
					pg.Exec(t, `ANALYZE {{schema}}.outbox`)
				}
				for _, st := range statements {
					for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
						plan := explain(t, pg, mode, pg.Schema.Render(st.sql), st.args)
						if strings.Contains(plan, "Seq Scan on outbox") {
							t.Fatalf("%s (analysed %v, %s) scans the whole outbox:\n%s", st.name, analysed, mode, plan)
						}
						if !strings.HasPrefix(st.name, "claim") {
							continue
						}
						// The gap probe: once per pass (not once per window row), a range scan of the
						// pending index bounded by the window's last seq.
						if !strings.Contains(plan, "CTE gaps") {
							t.Fatalf("claim (analysed %v, %s): the gap probe is not computed once per pass:\n%s", analysed, mode, plan)
						}
						var probe []string
						lines := strings.Split(plan, "\n")
						for i, line := range lines {
							if strings.HasSuffix(strings.TrimSpace(line), " on outbox e") {
								probe = lines[i:min(i+5, len(lines))] // the scan, and its bitmap index scan if any
							}
						}
						got := strings.Join(probe, "\n")
						if !strings.Contains(got, "outbox_pending_idx") || !strings.Contains(got, "Index Cond: (seq < ") {
							t.Fatalf("claim (analysed %v, %s): the gap probe is not a bounded range scan of the pending index:\n%s", analysed, mode, plan)
						}
					}
				}
			}
		})
	}
}

// A new row enters the primary key (the message id) and the pending index, and no other index:
// every index is paid for by every business transaction that writes an event, so the others must
// keep new rows out by their predicate.
func TestNewOutboxRowEntersTwoIndexes(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	msg := publish(t, pg, pg.Store, "k", 1)[0]
	rows, err := pg.Pool.Query(context.Background(), pg.Schema.Render(`
		SELECT c.relname, coalesce(pg_get_expr(i.indpred, i.indrelid), '')
		FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
		WHERE i.indrelid = '{{schema}}.outbox'::regclass ORDER BY 1`))
	if err != nil {
		t.Fatal(err)
	}
	preds := map[string]string{}
	for rows.Next() {
		var name, pred string
		if err := rows.Scan(&name, &pred); err != nil {
			t.Fatal(err)
		}
		preds[name] = pred
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var entered []string
	for name, pred := range preds {
		in := true
		if pred != "" {
			if err := pg.Pool.QueryRow(context.Background(),
				pg.Schema.Render(`SELECT `+pred+` FROM {{schema}}.outbox WHERE uuid = $1`), msg.UUID).Scan(&in); err != nil {
				t.Fatal(err)
			}
		}
		if in {
			entered = append(entered, name)
		}
	}
	slices.Sort(entered)
	if want := []string{"outbox_pending_idx", "outbox_uuid_key"}; !slices.Equal(entered, want) {
		t.Fatalf("a new row enters %v, want %v (indexes: %v)", entered, want, preds)
	}
}

func explain(t *testing.T, pg *testenv.PG, planCacheMode, query, literalArgs string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+planCacheMode); err != nil {
		t.Fatal(err)
	}
	// A named prepared statement so that plan_cache_mode applies, as in the relay's cached one.
	if _, err := tx.Prepare(ctx, "claim_plan", query); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Conn().Deallocate(ctx, "claim_plan") }() // the connection goes back to the pool
	execute := "EXECUTE claim_plan"
	if literalArgs != "" {
		execute += "(" + literalArgs + ")"
	}
	rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) "+execute)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// When the key's record cannot be committed (here a deferred constraint refuses it at commit), the
// client must not be told the operation succeeded, nor that nothing happened (a lost commit reply
// can hide a commit): it is told the outcome is unknown and to retry with the same key. The commit
// really failed: nothing survives.
func TestIdempotencyFailedCommitIsReportedAndKeepsNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pg.Exec(t, `CREATE TABLE {{schema}}.orders (id serial PRIMARY KEY, body text)`)
	pg.Exec(t, `CREATE FUNCTION {{schema}}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.key = 'fail-at-commit' THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NEW; END $$`)
	pg.Exec(t, `CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON {{schema}}.idempotency_keys
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{schema}}.refuse()`)
	mw, err := idempotency.Middleware(idempotency.Config{Store: pg.Store})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok, err := outboxkit.TxFrom[pgx.Tx](r.Context())
		if !ok || err != nil {
			once.Do(func() { t.Errorf("no pgx.Tx in the request context (%v)", err) })
			http.Error(w, "no transaction", 500)
			return
		}
		if _, err := tx.Exec(r.Context(), pg.Schema.Render(`INSERT INTO {{schema}}.orders (body) VALUES ('x')`)); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set(idempotency.Header, "fail-at-commit")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "outcome is unknown") || !strings.Contains(string(body), "retry with the same") {
		t.Fatalf("got %d %s; want 503 saying the outcome is unknown and to retry with the same key", resp.StatusCode, body)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.orders`); n != 0 {
		t.Fatalf("%d orders survived a failed commit", n)
	}
}

// A database that does not answer is told apart from one that refuses the statement: the first
// is an outage (the relay's circuit, the consumer's circuit), the second the message's fault.
func TestUnreachableIsToldApartFromRefused(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	down, err := pgxstore.New(pool, pgxstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.OutboxStats(context.Background(), time.Now())
	if err == nil || !outboxkit.IsUnreachable(err) || !down.IsUnreachable(err) {
		t.Fatalf("stats on a closed port: %v (unreachable %v); want it marked unreachable", err, outboxkit.IsUnreachable(err))
	}
	pg := testenv.NewPG(t)
	_, refused := pg.Pool.Exec(context.Background(), `SELECT * FROM no_such_table`)
	if refused == nil || pg.Store.IsUnreachable(refused) {
		t.Fatalf("a refused statement (%v) counted as unreachable", refused)
	}
	_, cut := pg.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pg_backend_pid())`)
	if cut == nil || !pg.Store.IsUnreachable(cut) {
		t.Fatalf("a session cut by the server (%v) not counted as unreachable", cut)
	}
}

// While a relay says it is awake, writers do not notify; once the time it gave has passed they do
// again.
func TestWritersSkipNotifyWhileARelayIsAwake(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	ctx := context.Background()
	notified := listenForWakeUps(t, pg)
	awaker, ok := pg.Store.Waker().(store.Awaker)
	if !ok {
		t.Fatal("the pgx store's waker cannot be told a relay is awake")
	}
	if err := awaker.Awake(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	publish(t, pg, pg.Store, "k", 1)
	if notified(300 * time.Millisecond) {
		t.Fatal("a writer notified while a relay said it was awake")
	}
	testenv.Eventually(t, 10*time.Second, "the awake time to pass", func() bool { return time.Since(start) > 2100*time.Millisecond })
	publish(t, pg, pg.Store, "k", 1)
	if !notified(5 * time.Second) {
		t.Fatal("no notification once the relay's awake time had passed")
	}
}

// Under a stream of commits the relay says it is awake and polls; every row is published, none
// waits for the 10s poll; once the stream stops and the relay sleeps again, a commit wakes it.
func TestBusyRelayStaysAwakeAndSleepsAgain(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	rec := recorder{sent: make(chan string, 100000)}
	// A threshold well under what four writers commit on a loaded machine (the soak and the other
	// packages share its two cores): the test proves the mechanism, not the machine's speed.
	f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: rec, PollInterval: 10 * time.Second,
		AwakeFor: 500 * time.Millisecond, AwakeAbove: 50})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunForwarder(t, f)
	awakeSeen := false
	var written int
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				publish(t, pg, pg.Store, fmt.Sprint("k", w), 1)
			}
		}()
	}
	for time.Now().Before(deadline) {
		if pg.Int(t, `SELECT count(*) FROM {{schema}}.relay_awake WHERE awake_until > clock_timestamp()`) == 1 {
			awakeSeen = true
		}
		<-time.After(20 * time.Millisecond)
	}
	wg.Wait()
	written = pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`)
	if !awakeSeen {
		t.Fatalf("the relay never said it was awake during a stream of %d commits", written)
	}
	testenv.Eventually(t, 5*time.Second, "every row of the stream to be published", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	testenv.Eventually(t, 5*time.Second, "the relay to stop saying it is awake", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.relay_awake WHERE awake_until > clock_timestamp()`) == 0
	})
	for len(rec.sent) > 0 {
		<-rec.sent
	}
	start := time.Now()
	msg := publish(t, pg, pg.Store, "after", 1)[0]
	for {
		select {
		case got := <-rec.sent:
			if got != msg.UUID {
				continue // a late duplicate of the stream
			}
			t.Logf("%d rows in the stream; after it, a commit published in %s", written, time.Since(start).Round(time.Millisecond))
			return
		case <-time.After(5 * time.Second):
			t.Fatal("after the stream, a commit did not wake the sleeping relay (the poll is 10s)")
		}
	}
}
