package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every database URL
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

// benchDrainStore is the drain on a store other than Postgres (--store mysql or sqlite): on MySQL
// outboxkit beside stock Watermill on MySQL (watermill-sql's MySQL schema and
// components/forwarder), on SQLite outboxkit to the in-process broker and to RabbitMQ (watermill-sql
// has no SQLite schema).
func benchDrainStore(ctx context.Context, c config) ([]series, error) {
	switch c.store {
	case "mysql":
		return benchDrainMySQL(ctx, c)
	case "sqlite":
		return benchDrainSQLite(ctx, c)
	}
	return nil, fmt.Errorf("--store %q: use postgres, mysql or sqlite", c.store)
}

func benchDrainMySQL(ctx context.Context, c config) ([]series, error) {
	fmt.Printf("\ndrain on MySQL/MariaDB (%s): %d preloaded events over %d keys → RabbitMQ with publisher confirms, %d reps\n",
		redactURL(c.mysqlURL), c.events, c.keys, c.reps)
	fmt.Printf("  stock Watermill: watermill-sql v4 MySQL schema + components/forwarder → watermill-amqp, tuned (poll %s, batch %d, pooled channel)\n",
		stockTuned.pollInterval, stockTuned.batchSize)
	ours := series{Name: "outboxkit forwarder on MySQL", Unit: "msg/s"}
	stock := series{Name: "stock Watermill on MySQL, tuned", Unit: "msg/s"}
	for rep := 1; rep <= c.reps; rep++ {
		o, err := drainStoreOnce(ctx, c, c.mysqlURL, c.brokerURL, rep)
		if err != nil {
			return nil, fmt.Errorf("outboxkit drain: %w", err)
		}
		ours.add(o)
		s, err := drainStockMySQL(ctx, c, rep)
		if err != nil {
			return nil, fmt.Errorf("stock drain: %w", err)
		}
		stock.add(s)
		fmt.Printf("  round %d: outboxkit %.0f, stock tuned %.0f msg/s\n", rep, o, s)
	}
	vs := ratio("outboxkit / stock tuned, MySQL", ours, stock)
	fmt.Print(table("drain rate on MySQL", []series{ours, stock}))
	fmt.Print(table("ratio, paired by round", []series{vs}))
	return []series{ours, stock, vs}, nil
}

func benchDrainSQLite(ctx context.Context, c config) ([]series, error) {
	dir, err := os.MkdirTemp("", "outboxkit-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("\ndrain on SQLite (a file in %s): %d preloaded events over %d keys, %d reps\n", dir, c.events, c.keys, c.reps)
	memory := series{Name: "outboxkit forwarder on SQLite → memory://", Unit: "msg/s"}
	rabbit := series{Name: "outboxkit forwarder on SQLite → RabbitMQ", Unit: "msg/s"}
	for rep := 1; rep <= c.reps; rep++ {
		m, err := drainStoreOnce(ctx, c, "sqlite://"+filepath.Join(dir, fmt.Sprintf("memory-%d.db", rep)), "memory://", rep)
		if err != nil {
			return nil, fmt.Errorf("drain to memory: %w", err)
		}
		memory.add(m)
		r, err := drainStoreOnce(ctx, c, "sqlite://"+filepath.Join(dir, fmt.Sprintf("amqp-%d.db", rep)), c.brokerURL, rep)
		if err != nil {
			return nil, fmt.Errorf("drain to RabbitMQ: %w", err)
		}
		rabbit.add(r)
		fmt.Printf("  round %d: → memory %.0f, → RabbitMQ %.0f msg/s\n", rep, m, r)
	}
	fmt.Print(table("drain rate on SQLite", []series{memory, rabbit}))
	return []series{memory, rabbit}, nil
}

// drainStoreOnce preloads c.events into the outbox of the store dbURL names (a database of its
// own on a server) and times a forwarder draining it to brokerURL.
func drainStoreOnce(ctx context.Context, c config, dbURL, brokerURL string, rep int) (float64, error) {
	schema := fmt.Sprintf("bench_ok_%d_%d", rep, time.Now().UnixNano()%1e9)
	db, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: schema})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		return 0, err
	}
	if db.Dialect == "mysql" {
		defer func() { _, _ = db.SQL.Exec("DROP DATABASE `" + schema + "`") }()
	}
	topic := "bench.store." + schema
	if err := preloadEvents(c, func(msgs []*message.Message) error {
		tx, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		pub, err := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}); err != nil {
		return 0, err
	}
	b, err := backends.Open(ctx, brokerURL, backends.Options{})
	if err != nil {
		return 0, err
	}
	defer b.Close()
	pub := newCountingPublisher(b.Publisher, c.events)
	published := func() error { return pub.wait(ctx, 5*time.Minute) }
	if strings.HasPrefix(brokerURL, "amqp") { // counted where they arrive, in order
		cnt, err := newCounter(brokerURL, topic, c.events)
		if err != nil {
			return 0, err
		}
		defer cnt.close()
		published = func() error { return cnt.wait(ctx, 5*time.Minute) }
	}
	return drainMarked(ctx, c, db, pub, published)
}

// drainStockMySQL is drainStock on MySQL: a watermill-sql topic with the MySQL schema, drained by
// Watermill's forwarder to watermill-amqp, tuned.
func drainStockMySQL(ctx context.Context, c config, rep int) (float64, error) {
	dsn, err := mysqlstore.DSN(c.mysqlURL)
	if err != nil {
		return 0, err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(store.DefaultMaxConns)
	return drainStock(ctx, c, stockSQL{
		name:     "mysql",
		beginner: wsql.BeginnerFromStdSQL(db),
		schema:   func(n int) wsql.SchemaAdapter { return wsql.DefaultMySQLSchema{SubscribeBatchSize: n} },
		offsets:  wsql.DefaultMySQLOffsetsAdapter{},
		drop: func(t string) {
			_, _ = db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `watermill_%s`, `watermill_offsets_%s`", t, t))
		},
	}, rep, stockTuned)
}

// redactURL hides a URL's password.
func redactURL(raw string) string { return store.RedactURL(raw) }
