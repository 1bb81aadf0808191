// Package postgresbackend uses a watermill-sql topic on Postgres as the broker, for teams without
// one: the forwarder moves rows from the outbox into it, and stock watermill-sql clients can read
// it. It registers postgres:// and postgresql:// with backends.Open.
package postgresbackend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/pgerr"
)

// openPostgres uses a watermill-sql topic (default schema: ordered, consumer groups) as the broker,
// for teams without one: the forwarder moves rows from the outbox into it.
func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	if opts.PollInterval == 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return backends.Parts{}, err
	}
	if !strings.Contains(rawURL, "pool_max_conns") {
		// Every subscription holds a connection for its polling transaction: pgxpool's default
		// (4 on this kind of machine) starves a handful of consumers. pool_max_conns in the URL wins.
		cfg.MaxConns = 32
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // connects on first use
	if err != nil {
		return backends.Parts{}, err
	}
	name := pgTable
	if opts.PostgresStockTableNames {
		name = pgStockTable
	}
	// BYTEA, not the default JSON: an outbox carries whatever bytes the writer stored (protobuf,
	// Avro, plain text), and a JSON column would refuse them at the broker after the outbox took them.
	adapter := pgTopicSchema{DefaultPostgreSQLSchema: wsql.DefaultPostgreSQLSchema{
		GeneratePayloadType:       func(string) string { return "BYTEA" },
		GenerateMessagesTableName: func(topic string) string { return name("watermill_", topic) },
	}, stockNames: opts.PostgresStockTableNames}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return name("watermill_offsets_", topic) },
	}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, opts.Logger)
	if err != nil {
		pool.Close()
		return backends.Parts{}, err
	}
	return backends.Parts{
		Publisher: brokerio.ClassifyingPublisher{Publisher: brokerio.MetadataFormat{Publisher: pub, Wire: brokerio.NewWire(opts)}, Classify: classifyPostgres, Ping: pool.Ping},
		Lag:       postgresTopicLag(pool, adapter, offsets),
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
				ConsumerGroup: group, SchemaAdapter: adapter, OffsetsAdapter: offsets,
				InitializeSchema: true, PollInterval: opts.PollInterval,
			}, opts.Logger)
			if err != nil {
				return nil, err
			}
			// The retrying subscriber's brokerio.Outlets also make Close wait for every channel: v4.1.5's
			// Close waits for its consume loops, but each loop signals done before its goroutine
			// closes the channel, so Close could return with the channel still open.
			return brokerio.NewRetryingSubscriber(sub, group, classifyPostgres, opts.Logger).ReadingForeign(), nil
		},
		Close: []func() error{pub.Close, func() error { pool.Close(); return nil }},
	}, nil
}

// pgTopicSchema is watermill-sql's default Postgres schema (ordered, consumer groups, payload
// BYTEA) with ids up to 255 bytes, as the outbox accepts them, where stock tables take 36. Before a
// topic is first used it checks a table that already exists — one stock watermill-sql made, say:
// a JSON payload column, which would refuse at the broker the bytes the outbox accepted, is refused
// with what to do; a VARCHAR(36) id column is widened to VARCHAR(255) (no rewrite, a brief lock;
// stock readers are unaffected).
type pgTopicSchema struct {
	wsql.DefaultPostgreSQLSchema
	stockNames bool
}

func (s pgTopicSchema) SchemaInitializingQueries(params wsql.SchemaInitializingQueriesParams) ([]wsql.Query, error) {
	if s.stockNames {
		if err := pgStockNamesFit(params.Topic); err != nil {
			return nil, err
		}
	}
	queries, err := s.DefaultPostgreSQLSchema.SchemaInitializingQueries(params)
	if err != nil {
		return nil, err
	}
	for i := range queries {
		queries[i].Query = strings.Replace(queries[i].Query, `"uuid" VARCHAR(36)`, `"uuid" VARCHAR(255)`, 1)
	}
	table := s.MessagesTable(params.Topic)
	literal := "'" + strings.ReplaceAll(table, "'", "''") + "'"
	check := `DO $check$
DECLARE
    payload_type text;
    uuid_type    text;
BEGIN
    SELECT format_type(atttypid, atttypmod) INTO payload_type FROM pg_attribute
    WHERE attrelid = to_regclass(` + literal + `) AND attname = 'payload' AND NOT attisdropped;
    IF payload_type IN ('json', 'jsonb') THEN
        RAISE EXCEPTION 'topic table % has a % payload column (stock watermill-sql''s default), which refuses the non-JSON bytes an outbox carries: convert it with ALTER TABLE % ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, ''UTF8''), or relay to a topic of its own',
            ` + literal + `, payload_type, ` + literal + `;
    END IF;
    SELECT format_type(atttypid, atttypmod) INTO uuid_type FROM pg_attribute
    WHERE attrelid = to_regclass(` + literal + `) AND attname = 'uuid' AND NOT attisdropped;
    IF uuid_type = 'character varying(36)' THEN
        EXECUTE 'ALTER TABLE ' || ` + literal + ` || ' ALTER COLUMN uuid TYPE VARCHAR(255)';
    END IF;
END
$check$`
	return append(queries, wsql.Query{Query: check}), nil
}

// pgStockTable names a topic's tables exactly as stock watermill-sql does, so that its stock clients
// find them (backends.Options.PostgresStockTableNames).
func pgStockTable(prefix, topic string) string {
	return `"` + strings.ReplaceAll(prefix+topic, `"`, `""`) + `"`
}

// pgStockNamesFit refuses a topic whose stock table names Postgres would cut at 63 bytes: two such
// topics sharing a start would share tables.
func pgStockNamesFit(topic string) error {
	if n := len("watermill_offsets_" + topic); n > 63 {
		return fmt.Errorf("topic %q is too long for stock watermill-sql table names: \"watermill_offsets_%s\" is %d bytes, "+
			"Postgres keeps 63 (topics of at most 45 bytes fit); use a shorter topic, or leave PostgresStockTableNames off "+
			"so that long topics get hashed table names", topic, topic, n)
	}
	return nil
}

// pgTable names a topic's table as watermill-sql does ("watermill_" + topic) while that fits in
// Postgres's 63-byte identifiers. A longer name would be cut silently by Postgres, and two topics
// sharing the first 63 bytes would share one table - their offsets mixed, messages skipped - so
// a long name keeps its start and ends with a hash of the whole topic.
func pgTable(prefix, topic string) string {
	name := prefix + topic
	if len(name) > 63 {
		sum := sha256.Sum256([]byte(topic))
		name = name[:63-17] + "_" + hex.EncodeToString(sum[:8])
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

func classifyPostgres(err error) error {
	if pgerr.AccessDenied(err) {
		return outboxkit.AccessDenied(err)
	}
	if outboxkit.IsUnreachable(err) || pgerr.IsUnreachable(err) {
		return outboxkit.Unreachable(err)
	}
	return err
}

// postgresTopicLag counts the topic's messages after the group's acknowledged position — the
// (transaction id, offset) pair watermill-sql's subscriber resumes from, which is also the order of
// the table's primary key — and the age of the first of them. A message being handled is not
// acknowledged until its transaction commits, so it counts as waiting: there is no separate unacked
// figure.
func postgresTopicLag(pool *pgxpool.Pool, adapter pgTopicSchema, offsets wsql.DefaultPostgreSQLOffsetsAdapter) func(ctx context.Context, topic, group string) (backends.Lag, error) {
	return func(ctx context.Context, topic, group string) (backends.Lag, error) {
		query := `SELECT count(*), EXTRACT(EPOCH FROM localtimestamp - min(m.created_at))::float8
			FROM ` + adapter.MessagesTable(topic) + ` AS m
			LEFT JOIN ` + offsets.MessagesOffsetsTable(topic) + ` AS o ON o.consumer_group = $1
			WHERE (m.transaction_id, m."offset") > (coalesce(o.last_processed_transaction_id, '0'::xid8), coalesce(o.offset_acked, 0))`
		var (
			n   int64
			age *float64
		)
		if err := pool.QueryRow(ctx, query, group).Scan(&n, &age); err != nil {
			return backends.Lag{}, classifyPostgres(err)
		}
		l := backends.Lag{Waiting: n}
		if age != nil {
			l.OldestAge, l.HasAge = max(0, time.Duration(*age*float64(time.Second))), true
		}
		return l, nil
	}
}

func init() {
	backends.Register(open, "postgres://user@host:5432/db (a watermill-sql topic)", "postgres", "postgresql")
}
