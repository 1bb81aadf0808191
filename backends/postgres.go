package backends

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/pgerr"
)

// openPostgres uses a watermill-sql topic (default schema: ordered, consumer groups) as the broker,
// for teams without one: the forwarder moves rows from the outbox into it.
func openPostgres(ctx context.Context, rawURL string, opts Options) (*Backend, error) {
	if opts.PollInterval == 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(rawURL, "pool_max_conns") {
		// Every subscription holds a connection for its polling transaction: pgxpool's default
		// (4 on this kind of machine) starves a handful of consumers. pool_max_conns in the URL wins.
		cfg.MaxConns = 32
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // connects on first use
	if err != nil {
		return nil, err
	}
	// BYTEA, not the default JSON: an outbox carries whatever bytes the writer stored (protobuf,
	// Avro, plain text), and a JSON column would refuse them at the broker after the outbox took them.
	adapter := wsql.DefaultPostgreSQLSchema{
		GeneratePayloadType:       func(string) string { return "BYTEA" },
		GenerateMessagesTableName: func(topic string) string { return pgTable("watermill_", topic) },
	}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return pgTable("watermill_offsets_", topic) },
	}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, opts.Logger)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Backend{
		Publisher: classifyingPublisher{Publisher: metadataFormat{Publisher: pub, wire: newWireFormat(opts)}, classify: classifyPostgres},
		Features:  Features{PerKeyOrder: "queue", Persistent: true, ConsumerGroups: true},
		newSubscriber: func(group string) (Subscriber, error) {
			sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
				ConsumerGroup: group, SchemaAdapter: adapter, OffsetsAdapter: offsets,
				InitializeSchema: true, PollInterval: opts.PollInterval,
			}, opts.Logger)
			if err != nil {
				return nil, err
			}
			// The retrying subscriber's relays also make Close wait for every channel: v4.1.5's
			// Close waits for its consume loops, but each loop signals done before its goroutine
			// closes the channel, so Close could return with the channel still open.
			return newRetryingSubscriber(sub, classifyPostgres, opts.Logger).readingForeign(), nil
		},
		closers: []func() error{pub.Close, func() error { pool.Close(); return nil }},
	}, nil
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
	if outboxkit.IsTransport(err) || pgerr.Unreachable(err) {
		return outboxkit.Transport(err)
	}
	return err
}
