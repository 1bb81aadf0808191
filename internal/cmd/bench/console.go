package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// The console scenario's data: where it lives, and its shape.
const consoleBenchSchema = "outboxkit_console_bench"

var benchEventTypes = []string{"OrderPlaced", "OrderPaid", "OrderShipped", "OrderCancelled", "PaymentCaptured", "PaymentRefunded",
	"StockReserved", "StockReleased", "ShipmentBooked", "ShipmentDelivered", "SearchIndexed", "PriceChanged"}

// benchConsole builds an outbox of --console-outbox rows (4% pending, 3% dead letters) and
// --console-dead consumers' dead letters (60 failure groups, 3 consumers, 200,000 keys, 30 days),
// then serves a real console.Handler over it and times every kind of page; then, unless
// --console-replay is 0, replays that many outbox letters at --console-rate while a writer and a
// relay run, and reports the job's rate and the live rows' latency before and during.
func benchConsole(ctx context.Context, c config) ([]series, error) {
	db, cleanup, err := openConsoleBench(ctx, c)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	fmt.Printf("\nconsole: %s, %d outbox rows, %d consumers' dead letters, %d samples a page, budget p95 %s\n",
		db.Info().Name, c.consoleOutbox, c.consoleDead, c.consoleSamples, c.consoleBudget)
	if err := buildConsoleBench(ctx, c, db); err != nil {
		return nil, err
	}
	rows, slow, err := timeConsolePages(ctx, c, db)
	if err != nil {
		return nil, err
	}
	if c.consoleReplay > 0 {
		r, err := benchConsoleReplay(ctx, c, db)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if len(slow) > 0 {
		return rows, fmt.Errorf("pages over the %s p95 budget: %s", c.consoleBudget, strings.Join(slow, ", "))
	}
	return rows, nil
}

func openConsoleBench(ctx context.Context, c config) (*store.DB, func(), error) {
	var dbURL string
	switch c.store {
	case "postgres":
		dbURL = c.dbURL
	case "mysql":
		dbURL = c.mysqlURL
	case "sqlite":
		if err := os.MkdirAll(".cache", 0o755); err != nil {
			return nil, nil, err
		}
		dbURL = "sqlite://" + filepath.Join(".cache", "console-bench.db")
	default:
		return nil, nil, fmt.Errorf("--store %q: use postgres, mysql or sqlite", c.store)
	}
	db, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: consoleBenchSchema, MaxConns: 8, PollOnly: true})
	if err != nil {
		return nil, nil, err
	}
	return db, func() { _ = db.Close() }, nil
}

// buildConsoleBench fills the tables, unless --console-reuse finds them built at this size.
func buildConsoleBench(ctx context.Context, c config, db *store.DB) error {
	q := func(s string) string {
		switch db.Dialect {
		case "postgres":
			return strings.ReplaceAll(s, "{{t}}.", `"`+consoleBenchSchema+`".`)
		case "mysql":
			return strings.ReplaceAll(s, "{{t}}.", "`"+consoleBenchSchema+"`.")
		}
		return strings.ReplaceAll(s, "{{t}}.", "")
	}
	if c.consoleReuse {
		var outbox, dead int
		err := db.SQL.QueryRowContext(ctx, q(`SELECT outbox_rows, dead_letters FROM {{t}}.console_bench_built`)).Scan(&outbox, &dead)
		if err == nil && outbox == c.consoleOutbox && dead == c.consoleDead {
			fmt.Println("  reusing the tables built by an earlier run")
			return nil
		}
	}
	start := time.Now()
	drop := map[string][]string{
		"postgres": {`DROP SCHEMA IF EXISTS "` + consoleBenchSchema + `" CASCADE`},
		"mysql":    {"DROP DATABASE IF EXISTS `" + consoleBenchSchema + "`"},
		"sqlite":   {"DROP TABLE IF EXISTS console_bench_built"},
	}[db.Dialect]
	if db.Dialect == "sqlite" {
		// A file of its own: start from an empty one.
		rows, err := db.SQL.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'`)
		if err != nil {
			return err
		}
		var names []string
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			names = append(names, n)
		}
		rows.Close()
		for _, n := range names {
			kind := "TABLE"
			if n == "outbox_messages" {
				kind = "VIEW"
			}
			drop = append(drop, "DROP "+kind+" IF EXISTS "+n)
		}
	}
	for _, s := range drop {
		if _, err := db.SQL.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("drop the old tables: %w", err)
		}
	}
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		return err
	}
	n, dead := c.consoleOutbox, c.consoleDead
	published := n * 96 / 100
	var stmts []string
	switch db.Dialect {
	case "postgres":
		stmts = pgConsoleBuild(n, dead, published)
	case "sqlite":
		stmts = sqliteConsoleBuild(n, dead, published)
	case "mysql":
		stmts = mysqlConsoleBuild(n, dead, published)
	}
	for i, s := range stmts {
		t := time.Now()
		if _, err := db.SQL.ExecContext(ctx, q(s)); err != nil {
			return fmt.Errorf("build step %d: %w", i+1, err)
		}
		fmt.Printf("  build step %d: %s\n", i+1, time.Since(t).Round(time.Millisecond))
	}
	// Failure groups through the real normaliser: one id per (event type, cause).
	t := time.Now()
	causes := []struct{ like, sample string }{
		{"decode %", "decode %s: invalid character 'x' looking for beginning of value"},
		{"customer %", `customer "c-1" has no billing account (--reject-customer)`},
		{"delivered %", "delivered 7 times without finishing (at most 5 allowed): the handler may be crashing the process"},
		{"failed on delivery 5 of 5: charge%", "failed on delivery 5 of 5: charge order-1: gateway answered 409 Conflict"},
		{"failed on delivery 5 of 5: rule%", "failed on delivery 5 of 5: rule 1 violated: sku SKU-1 is discontinued"},
	}
	outboxCauses := []struct{ like, sample string }{
		{"publish to shop.orders: message % rejected: payload too large%", "publish to shop.orders: message 0190f7e2-5c1a-7b3e-9d0a-2f4c6b8e1a3d rejected: payload too large (1 bytes > 1048576)"},
		{"publish to shop.orders: message % rejected: schema id%", "publish to shop.orders: message 0190f7e2-5c1a-7b3e-9d0a-2f4c6b8e1a3d rejected: schema id 1 unknown"},
	}
	ph := map[string]string{"postgres": "$%d", "mysql": "?", "sqlite": "?"}[db.Dialect]
	p := func(i int) string {
		if strings.Contains(ph, "%") {
			return fmt.Sprintf(ph, i)
		}
		return ph
	}
	for _, et := range benchEventTypes {
		for _, cause := range causes {
			sample := cause.sample
			if strings.Contains(sample, "%s") {
				sample = fmt.Sprintf(sample, et)
			}
			g, _ := store.FailureGroupOf(et, sample)
			if _, err := db.SQL.ExecContext(ctx, q(fmt.Sprintf(`UPDATE {{t}}.dead_letters SET failure_group = %s WHERE event_type = %s AND reason LIKE %s`, p(1), p(2), p(3))),
				g, et, cause.like); err != nil {
				return fmt.Errorf("group the dead letters: %w", err)
			}
		}
		for _, cause := range outboxCauses {
			g, _ := store.FailureGroupOf(et, cause.sample)
			if _, err := db.SQL.ExecContext(ctx, q(fmt.Sprintf(`UPDATE {{t}}.outbox SET failure_group = %s
WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND event_type = %s AND last_error LIKE %s`, p(1), p(2), p(3))), g, et, cause.like); err != nil {
				return fmt.Errorf("group the outbox's dead letters: %w", err)
			}
		}
	}
	fmt.Printf("  failure groups through store.FailureGroupOf: %s\n", time.Since(t).Round(time.Millisecond))
	// VACUUM as autovacuum would have on tables this old: an index-only scan needs the visibility map.
	analyze := map[string]string{"postgres": `VACUUM ANALYZE "` + consoleBenchSchema + `".outbox; VACUUM ANALYZE "` + consoleBenchSchema + `".dead_letters`,
		"mysql": "ANALYZE TABLE `" + consoleBenchSchema + "`.outbox, `" + consoleBenchSchema + "`.dead_letters", "sqlite": "ANALYZE"}[db.Dialect]
	for _, s := range strings.Split(analyze, "; ") {
		if _, err := db.SQL.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("analyze: %w", err)
		}
	}
	for _, s := range []string{`CREATE TABLE {{t}}.console_bench_built (outbox_rows BIGINT NOT NULL, dead_letters BIGINT NOT NULL)`,
		fmt.Sprintf(`INSERT INTO {{t}}.console_bench_built VALUES (%d, %d)`, n, dead)} {
		if _, err := db.SQL.ExecContext(ctx, q(s)); err != nil {
			return err
		}
	}
	fmt.Printf("  built in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// The outbox: rows 1..n over 30 days; every 32nd of the first 96% is a dead letter (3%), the rest
// of them published; the newest 4% pending. Dead letters: 3 consumers, 12 event types, 5 causes
// (decode 40%, billing 20%, crash 12%, gateway 8%, rule 20%), 10% already replayed.
func pgConsoleBuild(n, dead, published int) []string {
	return []string{fmt.Sprintf(`INSERT INTO {{t}}.outbox (uuid, seq, topic, partition_key, payload, metadata, created_at, published_at, attempts,
    dead_lettered_at, last_error, event_type)
OVERRIDING SYSTEM VALUE
SELECT md5(g::text)::uuid, g,
       'shop.' || (ARRAY['orders','orders','orders','payments','payments','shipments','search','inventory'])[(1 + g %% 8)::int],
       'order-' || (g * 7919 %% 200000),
       convert_to('{"order_id":"order-' || (g * 7919 %% 200000) || '","customer":"c-' || (g %% 5000) || '","note":"' || repeat('x', (g %% 200)::int) || '"}', 'UTF8'),
       '{"outboxkit_event_type":"' || et || '","traceparent":"00-' || md5(g::text) || '-' || substr(md5((g+1)::text),1,16) || '-01"}',
       now() - interval '30 days' + (g * (interval '30 days' / %[1]d)),
       CASE WHEN g <= %[2]d AND g %% 32 <> 0 THEN now() - interval '30 days' + (g * (interval '30 days' / %[1]d)) + interval '40 ms' END,
       CASE WHEN g <= %[2]d AND g %% 32 = 0 THEN 10 ELSE 0 END,
       CASE WHEN g <= %[2]d AND g %% 32 = 0 THEN now() - interval '30 days' + (g * (interval '30 days' / %[1]d)) + interval '9 minutes' END,
       CASE WHEN g <= %[2]d AND g %% 32 = 0 THEN 'publish to shop.orders: message ' || md5(g::text)::uuid || ' rejected: ' ||
            CASE WHEN g %% 3 = 0 THEN 'schema id ' || (g %% 90) || ' unknown' ELSE 'payload too large (' || (1048576 + g %% 5000) || ' bytes > 1048576)' END END,
       CASE WHEN g <= %[2]d AND g %% 32 = 0 THEN et END
FROM generate_series(1::bigint, %[1]d::bigint) AS g,
     LATERAL (SELECT (ARRAY['OrderPlaced','OrderPaid','OrderShipped','OrderCancelled','PaymentCaptured','PaymentRefunded','StockReserved','StockReleased','ShipmentBooked','ShipmentDelivered','SearchIndexed','PriceChanged'])[(1 + g %% 12)::int] AS et) AS e`, n, published),
		fmt.Sprintf(`SELECT setval(pg_get_serial_sequence('{{t}}.outbox', 'seq'), %d)`, n+1),
		fmt.Sprintf(`INSERT INTO {{t}}.dead_letters (consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at,
    replayed_at, partition_key, event_type, source_seq)
SELECT (ARRAY['billing','billing','billing','shipping','shipping','search'])[(1 + g %% 6)::int], 'shop.orders', md5('dl' || g)::uuid::text,
       convert_to('{"order_id":"order-' || (g * 104729 %% 200000) || '","customer":"c-' || (g %% 5000) || '","amount_cents":' || (g %% 100000) || '}', 'UTF8'),
       jsonb_build_object('outboxkit_event_type', et, 'outboxkit_partition_key', 'order-' || (g * 104729 %% 200000), 'outboxkit_seq', g::text,
                          'traceparent', '00-' || md5(g::text) || '-' || substr(md5((g+1)::text),1,16) || '-01'),
       CASE WHEN g %% 100 < 40 THEN 'decode ' || et || ': invalid character ''' || chr((97 + g %% 26)::int) || ''' looking for beginning of value'
            WHEN g %% 100 < 60 THEN 'customer "c-' || (g %% 5000) || '" has no billing account (--reject-customer)'
            WHEN g %% 100 < 72 THEN 'delivered ' || (6 + g %% 3) || ' times without finishing (at most 5 allowed): the handler may be crashing the process'
            WHEN g %% 100 < 80 THEN 'failed on delivery 5 of 5: charge order-' || (g %% 200000) || ': gateway answered 409 Conflict'
            ELSE 'failed on delivery 5 of 5: rule ' || (g %% 40) || ' violated: sku SKU-' || (g %% 977) || ' is discontinued' END,
       5, now() - interval '30 days' + (g * (interval '30 days' / %[1]d)),
       CASE WHEN g %% 10 = 0 THEN now() - interval '30 days' + (g * (interval '30 days' / %[1]d)) + interval '1 hour' END,
       'order-' || (g * 104729 %% 200000), et, g
FROM generate_series(1::bigint, %[1]d::bigint) AS g,
     LATERAL (SELECT (ARRAY['OrderPlaced','OrderPaid','OrderShipped','OrderCancelled','PaymentCaptured','PaymentRefunded','StockReserved','StockReleased','ShipmentBooked','ShipmentDelivered','SearchIndexed','PriceChanged'])[(1 + g %% 12)::int] AS et) AS e`, dead),
	}
}

const sqliteEventType = `CASE n % 12 WHEN 0 THEN 'OrderPlaced' WHEN 1 THEN 'OrderPaid' WHEN 2 THEN 'OrderShipped' WHEN 3 THEN 'OrderCancelled'
  WHEN 4 THEN 'PaymentCaptured' WHEN 5 THEN 'PaymentRefunded' WHEN 6 THEN 'StockReserved' WHEN 7 THEN 'StockReleased'
  WHEN 8 THEN 'ShipmentBooked' WHEN 9 THEN 'ShipmentDelivered' WHEN 10 THEN 'SearchIndexed' ELSE 'PriceChanged' END`

func sqliteConsoleBuild(n, dead, published int) []string {
	return []string{fmt.Sprintf(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %[1]d),
e(n, et) AS (SELECT n, %[3]s FROM g)
INSERT INTO outbox (seq, uuid, topic, partition_key, payload, metadata, created_at, published_at, attempts, dead_lettered_at, last_error, event_type)
SELECT n, lower(hex(randomblob(16))),
       'shop.' || CASE n %% 8 WHEN 0 THEN 'orders' WHEN 1 THEN 'orders' WHEN 2 THEN 'orders' WHEN 3 THEN 'payments'
                             WHEN 4 THEN 'payments' WHEN 5 THEN 'shipments' WHEN 6 THEN 'search' ELSE 'inventory' END,
       'order-' || (n * 7919 %% 200000),
       CAST('{"order_id":"order-' || (n * 7919 %% 200000) || '","customer":"c-' || (n %% 5000) || '","note":"' || substr(hex(zeroblob(100)), 1, n %% 200) || '"}' AS BLOB),
       '{"outboxkit_event_type":"' || et || '"}',
       strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', '-30 days', '+' || (n * 2592000.0 / %[1]d) || ' seconds'),
       CASE WHEN n <= %[2]d AND n %% 32 <> 0 THEN strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', '-30 days', '+' || (n * 2592000.0 / %[1]d + 0.04) || ' seconds') END,
       CASE WHEN n <= %[2]d AND n %% 32 = 0 THEN 10 ELSE 0 END,
       CASE WHEN n <= %[2]d AND n %% 32 = 0 THEN strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', '-30 days', '+' || (n * 2592000.0 / %[1]d + 540) || ' seconds') END,
       CASE WHEN n <= %[2]d AND n %% 32 = 0 THEN 'publish to shop.orders: message ' || lower(hex(randomblob(16))) || ' rejected: ' ||
            CASE WHEN n %% 3 = 0 THEN 'schema id ' || (n %% 90) || ' unknown' ELSE 'payload too large (' || (1048576 + n %% 5000) || ' bytes > 1048576)' END END,
       CASE WHEN n <= %[2]d AND n %% 32 = 0 THEN et END
FROM e`, n, published, sqliteEventType),
		fmt.Sprintf(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %[1]d),
e(n, et) AS (SELECT n, %[2]s FROM g)
INSERT INTO dead_letters (id, consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at, replayed_at,
    partition_key, event_type, source_seq)
SELECT n, CASE n %% 6 WHEN 0 THEN 'billing' WHEN 1 THEN 'billing' WHEN 2 THEN 'billing' WHEN 3 THEN 'shipping' WHEN 4 THEN 'shipping' ELSE 'search' END,
       'shop.orders', lower(hex(randomblob(16))),
       CAST('{"order_id":"order-' || (n * 104729 %% 200000) || '","amount_cents":' || (n %% 100000) || '}' AS BLOB),
       '{"outboxkit_event_type":"' || et || '","outboxkit_partition_key":"order-' || (n * 104729 %% 200000) || '","outboxkit_seq":"' || n || '"}',
       CASE WHEN n %% 100 < 40 THEN 'decode ' || et || ': invalid character ''' || char(97 + n %% 26) || ''' looking for beginning of value'
            WHEN n %% 100 < 60 THEN 'customer "c-' || (n %% 5000) || '" has no billing account (--reject-customer)'
            WHEN n %% 100 < 72 THEN 'delivered ' || (6 + n %% 3) || ' times without finishing (at most 5 allowed): the handler may be crashing the process'
            WHEN n %% 100 < 80 THEN 'failed on delivery 5 of 5: charge order-' || (n %% 200000) || ': gateway answered 409 Conflict'
            ELSE 'failed on delivery 5 of 5: rule ' || (n %% 40) || ' violated: sku SKU-' || (n %% 977) || ' is discontinued' END,
       5, strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', '-30 days', '+' || (n * 2592000.0 / %[1]d) || ' seconds'),
       CASE WHEN n %% 10 = 0 THEN strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', '-30 days', '+' || (n * 2592000.0 / %[1]d + 3600) || ' seconds') END,
       'order-' || (n * 104729 %% 200000), et, n
FROM e`, dead, sqliteEventType),
	}
}

func mysqlConsoleBuild(n, dead, published int) []string {
	et := strings.ReplaceAll(sqliteEventType, "n % 12", "n MOD 12")
	return []string{
		"SET SESSION max_recursive_iterations = 100000000",
		fmt.Sprintf(`INSERT INTO {{t}}.outbox (seq, uuid, topic, partition_key, payload, metadata, created_at, published_at, attempts, dead_lettered_at, last_error, event_type)
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %[1]d)
SELECT n, md5(n), CONCAT('shop.', ELT(1 + n MOD 8, 'orders','orders','orders','payments','payments','shipments','search','inventory')),
       CONCAT('order-', n * 7919 MOD 200000), CONCAT('{"order_id":"order-', n * 7919 MOD 200000, '","note":"', REPEAT('x', n MOD 200), '"}'),
       CONCAT('{"outboxkit_event_type":"', %[3]s, '"}'),
       UTC_TIMESTAMP(6) - INTERVAL 30 DAY + INTERVAL (n * 2592000 / %[1]d) SECOND,
       IF(n <= %[2]d AND n MOD 32 <> 0, UTC_TIMESTAMP(6) - INTERVAL 30 DAY + INTERVAL (n * 2592000 / %[1]d) SECOND, NULL),
       IF(n <= %[2]d AND n MOD 32 = 0, 10, 0),
       IF(n <= %[2]d AND n MOD 32 = 0, UTC_TIMESTAMP(6) - INTERVAL 30 DAY + INTERVAL (n * 2592000 / %[1]d + 540) SECOND, NULL),
       IF(n <= %[2]d AND n MOD 32 = 0, CONCAT('publish to shop.orders: message ', md5(n), ' rejected: ',
            IF(n MOD 3 = 0, CONCAT('schema id ', n MOD 90, ' unknown'), CONCAT('payload too large (', 1048576 + n MOD 5000, ' bytes > 1048576)'))), NULL),
       IF(n <= %[2]d AND n MOD 32 = 0, %[3]s, NULL)
FROM g`, n, published, et),
		fmt.Sprintf(`INSERT INTO {{t}}.dead_letters (consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at, replayed_at,
    partition_key, event_type, source_seq)
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %[1]d)
SELECT ELT(1 + n MOD 6, 'billing','billing','billing','shipping','shipping','search'), 'shop.orders', md5(CONCAT('dl', n)),
       CONCAT('{"order_id":"order-', n * 104729 MOD 200000, '"}'),
       CONCAT('{"outboxkit_event_type":"', %[2]s, '","outboxkit_partition_key":"order-', n * 104729 MOD 200000, '","outboxkit_seq":"', n, '"}'),
       CASE WHEN n MOD 100 < 40 THEN CONCAT('decode ', %[2]s, ': invalid character ''', CHAR(97 + n MOD 26), ''' looking for beginning of value')
            WHEN n MOD 100 < 60 THEN CONCAT('customer "c-', n MOD 5000, '" has no billing account (--reject-customer)')
            WHEN n MOD 100 < 72 THEN CONCAT('delivered ', 6 + n MOD 3, ' times without finishing (at most 5 allowed): the handler may be crashing the process')
            WHEN n MOD 100 < 80 THEN CONCAT('failed on delivery 5 of 5: charge order-', n MOD 200000, ': gateway answered 409 Conflict')
            ELSE CONCAT('failed on delivery 5 of 5: rule ', n MOD 40, ' violated: sku SKU-', n MOD 977, ' is discontinued') END,
       5, UTC_TIMESTAMP(6) - INTERVAL 30 DAY + INTERVAL (n * 2592000 / %[1]d) SECOND,
       IF(n MOD 10 = 0, UTC_TIMESTAMP(6) - INTERVAL 30 DAY + INTERVAL (n * 2592000 / %[1]d + 3600) SECOND, NULL),
       CONCAT('order-', n * 104729 MOD 200000), %[2]s, n
FROM g`, dead, et),
	}
}

// pageKind is one kind of console page, with a way to pick its random parameters.
type pageKind struct {
	name string
	path func(r *rand.Rand) string
}

func timeConsolePages(ctx context.Context, c config, db *store.DB) ([]series, []string, error) {
	con, _ := store.ConsoleOf(db)
	const token = "console-bench-operator-secret"
	h, err := console.New(console.Config{Store: db, Prefix: "/console", Auth: console.Auth{Tokens: []console.Token{{Name: "bench", Role: console.Operator, Secret: token}}},
		Publisher: discard{}, DisableJobs: true, Consumers: map[string][]string{"billing": {"shop.orders"}, "shipping": {"shop.orders"}, "search": {"shop.orders"}}})
	if err != nil {
		return nil, nil, err
	}
	// Started, as a console serving people is: it keeps its figures warm in the background.
	if err := h.Start(ctx); err != nil {
		return nil, nil, err
	}
	defer h.Stop(context.Background())
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	get := func(path string) (time.Duration, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: %d", path, resp.StatusCode)
		}
		return d, err
	}
	// The cold overview: every figure read, nothing cached.
	cold, err := get("/console/")
	if err != nil {
		return nil, nil, err
	}
	fmt.Printf("  cold overview (every cached figure read): %s\n", cold.Round(time.Millisecond))

	// Parameters: the largest group, letters to open, positions to page from.
	groups, err := con.GroupCounts(ctx, store.LetterQuery{Side: "billing"}, 0)
	if err != nil || len(groups) == 0 {
		return nil, nil, fmt.Errorf("no failure groups (%v)", err)
	}
	largest := groups[0]
	sample, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: "billing", Limit: 200})
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	var cursors []string
	for _, l := range sample.Letters {
		ids = append(ids, l.ID)
	}
	// Deep pages: cursors spread over the 30 days.
	for i := 1; i <= 50; i++ {
		at := time.Now().Add(-time.Duration(i) * 14 * time.Hour)
		cursors = append(cursors, fmt.Sprintf("%d.c.%d", at.UnixMicro(), int64(1)<<62))
	}
	outboxDead, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox, Limit: 50})
	if err != nil || len(outboxDead.Letters) == 0 {
		return nil, nil, fmt.Errorf("no outbox dead letters (%v)", err)
	}
	pick := func(r *rand.Rand, v []string) string { return v[r.IntN(len(v))] }
	consumers := []string{"billing", "shipping", "search"}
	kinds := []pageKind{
		{"overview", func(*rand.Rand) string { return "/console/" }},
		{"letters, everywhere", func(*rand.Rand) string { return "/console/letters" }},
		{"letters, one consumer", func(r *rand.Rand) string { return "/console/letters?side=" + pick(r, consumers) }},
		{"letters, outbox", func(*rand.Rand) string { return "/console/letters?side=outbox" }},
		{"letters, largest group", func(*rand.Rand) string {
			return fmt.Sprintf("/console/letters?side=billing&group=%d", largest.FailureGroup)
		}},
		{"letters, one key", func(r *rand.Rand) string { return fmt.Sprintf("/console/letters?key=order-%d", r.IntN(200000)) }},
		{"letters, type+topic matching nothing", func(r *rand.Rand) string {
			return "/console/letters?side=billing&type=OrderPaid&topic=shop.nowhere"
		}},
		{"letters, error text", func(r *rand.Rand) string { return "/console/letters?side=" + pick(r, consumers) + "&q=billing+account" }},
		{"letters, last 6 hours", func(*rand.Rand) string { return "/console/letters?within=6h" }},
		{"letters, deep keyset page", func(r *rand.Rand) string {
			return "/console/letters?side=billing&before=" + url.QueryEscape(pick(r, cursors))
		}},
		{"detail", func(r *rand.Rand) string { return fmt.Sprintf("/console/letters/billing/%d", ids[r.IntN(len(ids))]) }},
		{"detail, outbox", func(r *rand.Rand) string {
			return fmt.Sprintf("/console/letters/outbox/%d", outboxDead.Letters[r.IntN(len(outboxDead.Letters))].ID)
		}},
		{"preview, largest group", func(*rand.Rand) string {
			return fmt.Sprintf("/console/replay/preview?side=billing&group=%d&kind=archive", largest.FailureGroup)
		}},
		{"jobs", func(*rand.Rand) string { return "/console/jobs" }},
		{"audit", func(*rand.Rand) string { return "/console/audit" }},
	}
	r := rand.New(rand.NewPCG(1, 2))
	var rows []series
	var slow []string
	fmt.Printf("  %-38s %9s %9s %9s  (ms, %d requests each, caches warm)\n", "page", "p50", "p95", "p99", c.consoleSamples)
	for _, k := range kinds {
		if _, err := get(k.path(r)); err != nil { // warm: the page's caches, the plans
			return nil, nil, fmt.Errorf("%s: %w", k.name, err)
		}
		var times []float64
		for i := 0; i < c.consoleSamples; i++ {
			d, err := get(k.path(r))
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", k.name, err)
			}
			times = append(times, float64(d.Microseconds())/1000)
		}
		slices.Sort(times)
		p := func(q float64) float64 { return times[min(len(times)-1, int(q*float64(len(times))))] }
		fmt.Printf("  %-38s %9.1f %9.1f %9.1f\n", k.name, p(0.5), p(0.95), p(0.99))
		rows = append(rows, series{Name: "console " + db.Dialect + ": " + k.name + " p95", Unit: "ms", Values: []float64{p(0.95)}})
		if p(0.95) > float64(c.consoleBudget.Milliseconds()) {
			slow = append(slow, fmt.Sprintf("%s (%.0f ms)", k.name, p(0.95)))
		}
	}
	rows = append(rows, series{Name: "console " + db.Dialect + ": cold overview", Unit: "ms", Values: []float64{float64(cold.Microseconds()) / 1000}})
	return rows, slow, nil
}

// latencyPublisher records each live row's commit-to-publish latency (rows written by the
// writer carry their write time).
type latencyPublisher struct {
	mu        sync.Mutex
	latencies []time.Duration
	replayed  atomic.Int64
}

func (p *latencyPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if at, err := time.Parse(time.RFC3339Nano, m.Metadata.Get("bench_written_at")); err == nil {
			p.mu.Lock()
			p.latencies = append(p.latencies, time.Since(at))
			p.mu.Unlock()
		} else {
			p.replayed.Add(1)
		}
	}
	return nil
}
func (p *latencyPublisher) Close() error { return nil }

func (p *latencyPublisher) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.latencies
	p.latencies = nil
	return out
}

func p95(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*95/100)]
}

// benchConsoleReplay replays --console-replay outbox dead letters at --console-rate while a
// writer commits 1,000 rows a second and one relay publishes: the job must keep to its rate (or
// wait on backpressure, and say so), and the live rows must not wait much longer than before.
func benchConsoleReplay(ctx context.Context, c config, db *store.DB) ([]series, error) {
	con, _ := store.ConsoleOf(db)
	// The bench's tables change: the next --console-reuse rebuilds them.
	if _, err := db.SQL.ExecContext(ctx, db.Rebind(strings.ReplaceAll(`DELETE FROM {{t}}console_bench_built`, "{{t}}", map[string]string{
		"postgres": `"` + consoleBenchSchema + `".`, "mysql": "`" + consoleBenchSchema + "`.", "sqlite": ""}[db.Dialect]))); err != nil {
		return nil, err
	}
	pub := &latencyPublisher{}
	f, err := forwarder.New(forwarder.Config{Store: db, Publisher: pub, Name: "bench", Retention: forwarder.Retention{Keep: true}})
	if err != nil {
		return nil, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = f.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		t := time.NewTicker(10 * time.Millisecond) // 10 rows every 10 ms: 1,000 a second
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			tx, err := db.SQL.BeginTx(wctx, nil)
			if err != nil {
				continue
			}
			p, _ := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
			var msgs []*message.Message
			for j := 0; j < 10; j++ {
				m := pipeline.NewEvent("OrderPlaced", fmt.Sprintf("live-%d", (i*10+j)%5000), []byte(`{}`))
				m.Metadata.Set("bench_written_at", time.Now().Format(time.RFC3339Nano))
				msgs = append(msgs, m)
			}
			if p.Publish("shop.live", msgs...) == nil {
				_ = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
	}()
	defer func() { stopWriter(); <-writerDone }()
	// The built backlog (4% of the outbox, pending) goes out first, and the live rows that queued
	// behind it: the relay is caught up when a few hundred rows at most wait (a third of a second
	// of the writer's).
	drainStart := time.Now()
	for {
		backlog, capped, err := con.TopicBacklog(ctx, 1000)
		if err != nil {
			return nil, err
		}
		pending := 0
		for _, b := range backlog {
			pending += int(b.Pending)
		}
		if !capped && pending < 300 {
			break
		}
		if time.Since(drainStart) > 10*time.Minute {
			return nil, fmt.Errorf("the relay did not publish the built backlog within 10 minutes")
		}
		if !sleepCtx(ctx, time.Second) {
			return nil, ctx.Err()
		}
	}
	fmt.Printf("  the relay published the built backlog, and caught up with the writer, in %s\n", time.Since(drainStart).Round(time.Second))
	pub.take()
	measure := 20 * time.Second
	fmt.Printf("  bulk replay: writer 1,000 rows/s and a relay for %s, then a replay of up to %d outbox letters at %d/s\n", measure, c.consoleReplay, c.consoleRate)
	if !sleepCtx(ctx, measure) {
		return nil, ctx.Err()
	}
	before := p95(pub.take())
	h, err := console.New(console.Config{Store: db, Auth: console.Auth{LocalOnly: true}, MaxRate: max(c.consoleRate, console.DefaultMaxRate),
		DefaultRate: min(c.consoleRate, console.DefaultRate)})
	if err != nil {
		return nil, err
	}
	// A selection of about --console-replay letters: the oldest, up to a time.
	letters, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox, Limit: 1})
	if err != nil || len(letters.Letters) == 0 {
		return nil, fmt.Errorf("no outbox letter to replay (%v)", err)
	}
	total, _, err := con.CountDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox}, -1)
	if err != nil {
		return nil, err
	}
	// Letters are spread evenly over 30 days: take the share that holds about --console-replay.
	span := time.Duration(float64(30*24*time.Hour) * min(1, float64(c.consoleReplay)/float64(total)))
	q := store.LetterQuery{Side: store.SideOutbox, Until: time.Now().Add(-30*24*time.Hour + span + 10*time.Minute)}
	job, _, err := con.CreateJob(ctx, store.NewJob{Kind: store.JobReplay, Filter: q, RequestKey: fmt.Sprintf("bench-%d", time.Now().UnixNano()),
		Rate: c.consoleRate, By: "bench", Now: time.Now()})
	if err != nil {
		return nil, err
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	var waited time.Duration
	lastWaiting := ""
	for {
		j, err := con.Job(ctx, job.ID)
		if err != nil {
			_ = h.Stop(context.Background())
			return nil, err
		}
		if j.Waiting != "" {
			waited += 200 * time.Millisecond
			lastWaiting = j.Waiting
		}
		if !j.Open() || time.Since(start) > time.Duration(float64(job.Total)/float64(c.consoleRate)*3*float64(time.Second))+time.Minute {
			_ = h.Stop(context.Background())
			elapsed := time.Since(start)
			during := p95(pub.take())
			achieved := float64(j.Applied) / elapsed.Seconds()
			fmt.Printf("  job #%d %s: %d of %d letters replayed in %s: %.0f/s (set %d/s); waited on backpressure %s%s\n", j.ID, j.State, j.Applied, j.Total,
				elapsed.Round(time.Second), achieved, c.consoleRate, waited.Round(time.Second), map[bool]string{true: " (" + lastWaiting + ")"}[lastWaiting != ""])
			fmt.Printf("  live rows commit→publish p95: %s before, %s during the replay (replayed rows the relay published: %d)\n",
				before.Round(time.Millisecond), during.Round(time.Millisecond), pub.replayed.Load())
			return []series{
				{Name: "console " + db.Dialect + ": bulk replay rate", Unit: "msg/s", Values: []float64{achieved}},
				{Name: "console " + db.Dialect + ": live p95 before replay", Unit: "ms", Values: []float64{float64(before.Microseconds()) / 1000}},
				{Name: "console " + db.Dialect + ": live p95 during replay", Unit: "ms", Values: []float64{float64(during.Microseconds()) / 1000}},
			}, nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			_ = h.Stop(context.Background())
			return nil, ctx.Err()
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
