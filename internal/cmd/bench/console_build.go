package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// benchEventTypes are the 12 event types the built rows spread over (the SQL builds name them too):
// the dead letters' failure groups are one per event type and cause.
var benchEventTypes = []string{"OrderPlaced", "OrderPaid", "OrderShipped", "OrderCancelled", "PaymentCaptured", "PaymentRefunded",
	"StockReserved", "StockReleased", "ShipmentBooked", "ShipmentDelivered", "SearchIndexed", "PriceChanged"}

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
