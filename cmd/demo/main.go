// Command demo places a few orders and follows each OrderPlaced event hop by hop: the business
// transaction that writes the order and its outbox row, the forwarder that publishes it to the
// broker with a confirm, and a consumer that receives it.
//
//	go run ./cmd/demo [--db URL] [--broker URL] [--orders N]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
)

const (
	schemaName = "outboxkit_demo"
	topic      = "outboxkit_demo.orders"
)

type orderPlaced struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int    `json:"total_cents"`
}

func main() {
	dbURL := flag.String("db", env("OUTBOXKIT_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"Postgres URL (env OUTBOXKIT_DATABASE_URL)")
	brokerURL := flag.String("broker", env("OUTBOXKIT_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		"RabbitMQ URL (env OUTBOXKIT_BROKER_URL)")
	orders := flag.Int("orders", 5, "how many orders to place")
	flag.Parse()
	if *orders < 1 {
		fmt.Fprintln(os.Stderr, "demo: --orders must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dbURL, *brokerURL, *orders); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL, brokerURL string, n int) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("database URL %q: %w", dbURL, err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("cannot reach Postgres at %s: %w (start it, or pass --db)", dbURL, err)
	}
	res, err := pipeline.Migrate(ctx, db, schemaName)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schemaName+`.orders (
		id text PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create orders table: %w", err)
	}
	step("setup", "schema %s at version %d; broker %s", schemaName, res.Version, redact(brokerURL))

	runID := time.Now().UTC().Format("150405")
	var (
		mu       sync.Mutex
		received = map[string]bool{}
		all      = make(chan struct{})
	)

	// The consumer: a Watermill router reading the "shipping" queue.
	sub, err := backends.NewAMQPSubscriber(backends.AMQPSubscriberConfig{URL: brokerURL, ConsumerGroup: "shipping"})
	if err != nil {
		return fmt.Errorf("cannot reach RabbitMQ at %s: %w (start it, or pass --broker)", redact(brokerURL), err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddConsumerHandler("shipping", topic, sub, func(msg *message.Message) error {
		var ev orderPlaced
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			step("shipping", "unreadable message %s: %v", msg.UUID, err)
			return nil
		}
		if !strings.HasPrefix(ev.OrderID, "o-"+runID+"-") {
			step("shipping", "%s %s from an earlier run, acknowledged", outboxkit.EventType(msg), ev.OrderID)
			return nil
		}
		since := ""
		if created, ok := outboxkit.CreatedAt(msg); ok {
			since = fmt.Sprintf(", %s after commit", time.Since(created).Round(100*time.Microsecond))
		}
		step("shipping", "%s %s received (uuid %s)%s", outboxkit.EventType(msg), ev.OrderID, short(msg.UUID), since)
		mu.Lock()
		received[ev.OrderID] = true
		if len(received) == n {
			close(all)
		}
		mu.Unlock()
		return nil
	})
	routerCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(routerCtx) }()
	<-router.Running()

	// The forwarder, publishing to RabbitMQ with confirms; the wrapper prints each confirmed hop.
	amqpPub, err := backends.NewAMQPPublisher(backends.AMQPConfig{URL: brokerURL})
	if err != nil {
		return fmt.Errorf("cannot reach RabbitMQ at %s: %w (start it, or pass --broker)", redact(brokerURL), err)
	}
	defer amqpPub.Close()
	relay, err := forwarder.New(forwarder.Config{
		Pool: pool, Schema: schemaName, Name: "demo",
		Publisher: printingPublisher{amqpPub},
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	<-relay.Running()

	// The order service: each order and its event in one transaction.
	start := time.Now()
	for i := 1; i <= n; i++ {
		ev := orderPlaced{OrderID: fmt.Sprintf("o-%s-%d", runID, i), Customer: fmt.Sprintf("customer-%d", i), TotalCents: 1000 * i}
		if err := placeOrder(ctx, pool, ev); err != nil {
			return err
		}
	}

	var failure error
	select {
	case <-all:
		step("shipping", "all %d events received %s after the first order", n, time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		mu.Lock()
		failure = fmt.Errorf("only %d of %d events reached the consumer within 30s", len(received), n)
		mu.Unlock()
	case <-ctx.Done():
		failure = errors.New("interrupted")
	}
	// A consumer may see a message before the forwarder sees the broker's confirm; let the
	// forwarder mark what it published before stopping it.
	var stats forwarder.Stats
	for deadline := time.Now().Add(5 * time.Second); failure == nil; {
		if stats, err = relay.Stats(ctx); err != nil || stats.Pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopRelay()
	stopRouter()
	<-relayDone
	<-routerDone
	if failure != nil {
		return failure
	}
	if err != nil {
		return err
	}
	step("done", "%d orders placed, published and received; outbox: %d pending, %d dead-lettered",
		n, stats.Pending, stats.DeadLettered)
	return nil
}

func placeOrder(ctx context.Context, pool *pgxpool.Pool, ev orderPlaced) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO `+schemaName+`.orders (id, customer, total_cents) VALUES ($1, $2, $3)`,
		ev.OrderID, ev.Customer, ev.TotalCents); err != nil {
		return fmt.Errorf("insert order %s: %w", ev.OrderID, err)
	}
	msg, err := pipeline.NewJSONEvent("OrderPlaced", ev.OrderID, ev)
	if err != nil {
		return err
	}
	pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: schemaName})
	if err != nil {
		return err
	}
	if err := pub.Publish(topic, msg); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit order %s: %w", ev.OrderID, err)
	}
	step("order", "%s committed with its OrderPlaced event (uuid %s) in one transaction", ev.OrderID, short(msg.UUID))
	return nil
}

// printingPublisher reports each message the broker confirmed.
type printingPublisher struct{ message.Publisher }

func (p printingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		since := ""
		if created, ok := outboxkit.CreatedAt(m); ok {
			since = fmt.Sprintf(", %s after commit", time.Since(created).Round(100*time.Microsecond))
		}
		step("forwarder", "outbox seq %s → RabbitMQ exchange %s, confirmed%s",
			m.Metadata.Get(outboxkit.MetadataSeq), topic, since)
	}
	return nil
}

var printMu sync.Mutex

func step(hop, format string, args ...any) {
	printMu.Lock()
	defer printMu.Unlock()
	fmt.Printf("%-12s %s\n", "["+hop+"]", fmt.Sprintf(format, args...))
}

func short(uuid string) string {
	if len(uuid) > 13 {
		return uuid[:13] + "…"
	}
	return uuid
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func redact(u string) string {
	if at := strings.Index(u, "@"); at > 0 {
		if colon := strings.LastIndex(u[:at], ":"); colon > strings.Index(u, "//")+1 {
			return u[:colon+1] + "***" + u[at:]
		}
	}
	return u
}
