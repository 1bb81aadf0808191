package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend" // memory://; import your broker's package
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

type OrderPlaced struct {
	ID string `json:"id"`
}

// shop is a migrated SQLite store with a shipments table, and an in-process broker.
func shop() (st *sqlitestore.Store, broker *backends.Backend, cleanup func()) {
	dir, _ := os.MkdirTemp("", "example")
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	if _, err := st.DB().Exec(`CREATE TABLE shipments (order_id TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	broker, err = backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	return st, broker, func() { broker.Close(); st.DB().Close(); os.RemoveAll(dir) }
}

// awaitStats polls the consumer's inbox statistics until cond holds (or a minute passes).
func awaitStats(st store.Store, consumer string, cond func(middleware.ConsumerStats) bool) middleware.ConsumerStats {
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		stats, err := middleware.Stats(context.Background(), st)
		if err != nil {
			log.Fatal(err)
		}
		for _, s := range stats {
			if s.Consumer == consumer && cond(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("%s: %+v", consumer, stats)
		}
	}
	return middleware.ConsumerStats{}
}

// A consumer behind the recommended stack: its typed handler makes the effect in the inbox's
// transaction (here a *sql.Tx; a pgx.Tx with store/pgxstore), so a message delivered twice is
// applied once.
func ExampleStack() {
	st, broker, cleanup := shop()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sub, err := broker.NewSubscriber("shipping") // the consumer's name, on the broker and in the inbox alike
	if err != nil {
		log.Fatal(err)
	}
	stack, err := middleware.Stack(middleware.StackConfig{Store: st, Consumer: "shipping"})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	h := router.AddConsumerHandler("shipping", "orders", sub, handlers.JSON(
		func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES (?)`, o.ID)
			return err // nil: the effect and the inbox row commit together
		}))
	h.AddMiddleware(stack...)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-1", OrderPlaced{ID: "o-1"})
	_ = broker.Publisher.Publish("orders", msg)
	_ = broker.Publisher.Publish("orders", msg.Copy()) // the same message again, as a broker may redeliver it

	s := awaitStats(st, "shipping", func(s middleware.ConsumerStats) bool { return s.Processed+s.Duplicates == 2 })
	var shipments int
	_ = st.DB().QueryRow(`SELECT count(*) FROM shipments`).Scan(&shipments)
	fmt.Printf("processed %d, duplicates %d, shipments %d\n", s.Processed, s.Duplicates, shipments)
	// Output: processed 1, duplicates 1, shipments 1
}

// The same consumer added in one call: the handler, its stack and its subscription under one
// consumer name. A subscriber that reads for another consumer is refused here, before anything
// runs, where a stack built for the wrong name would hold every message it is given.
func ExampleAddConsumerHandler() {
	st, broker, cleanup := shop()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	ship := handlers.JSON(func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES (?)`, o.ID)
		return err
	})

	wrong, _ := broker.NewSubscriber("shipping-v2")
	_, err = middleware.AddConsumerHandler(router, "shipping", "orders", wrong,
		middleware.StackConfig{Store: st, Consumer: "shipping"}, ship)
	fmt.Println("refused:", errors.Is(err, middleware.ErrWrongConsumer))

	sub, _ := broker.NewSubscriber("shipping")
	if _, err := middleware.AddConsumerHandler(router, "shipping", "orders", sub,
		middleware.StackConfig{Store: st, Consumer: "shipping"}, ship); err != nil {
		log.Fatal(err)
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-1", OrderPlaced{ID: "o-1"})
	_ = broker.Publisher.Publish("orders", msg)
	s := awaitStats(st, "shipping", func(s middleware.ConsumerStats) bool { return s.Processed == 1 })
	fmt.Println("processed", s.Processed)
	// Output:
	// refused: true
	// processed 1
}

// A consumer that applies many messages in one transaction — one inbox INSERT and one COMMIT per
// batch — with the same guarantees; a subscriber that hands out several messages at once
// (backends.Options.Unacked) fills the batches.
func ExampleNewBatchConsumer() {
	st, broker, cleanup := shop()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sub, err := broker.NewSubscriber("shipping")
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := middleware.NewBatchConsumer(middleware.BatchConfig{
		StackConfig: middleware.StackConfig{Store: st, Consumer: "shipping"},
		MaxBatch:    100,
	}, sub, "orders", middleware.NoPublish(handlers.JSON(
		func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES (?)`, o.ID)
			return err
		})))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	<-consumer.Running()

	for _, id := range []string{"o-1", "o-2", "o-3"} {
		msg, _ := pipeline.NewJSONEvent("OrderPlaced", id, OrderPlaced{ID: id})
		_ = broker.Publisher.Publish("orders", msg)
	}
	s := awaitStats(st, "shipping", func(s middleware.ConsumerStats) bool { return s.Processed == 3 })
	cancel()
	fmt.Println("processed", s.Processed, "run:", <-done)
	// Output: processed 3 run: <nil>
}

// A consumer serving many tenants, each in a database of its own: every message is applied in its
// tenant's database (outboxkit.Tenant, stamped by a relay fleet or the writer), its inbox row and
// its effect together; a message of a tenant the consumer does not serve is dead-lettered in the
// service's own database, and applied nowhere.
func ExampleAddTenantConsumerHandler() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Where each tenant's database is: the service's configuration, or a catalog of tenants.
	databases := map[string]string{
		"acme":   "sqlite://" + filepath.Join(dir, "acme.db"),
		"globex": "sqlite://" + filepath.Join(dir, "globex.db"),
	}
	tenants := middleware.NewTenantOpener(func(_ context.Context, tenant string) (middleware.TenantDatabase, error) {
		u, ok := databases[tenant]
		if !ok {
			return middleware.TenantDatabase{}, middleware.UnknownTenant(tenant)
		}
		return middleware.TenantDatabase{URL: u}, nil
	})
	defer tenants.Close() // runs once the router has stopped

	// Each tenant's database is migrated when the tenant is set up.
	for tenant := range databases {
		st, err := tenants.TenantStore(ctx, tenant)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := pipeline.Migrate(ctx, st); err != nil {
			log.Fatal(err)
		}
		if _, err := st.(*store.DB).SQL.Exec(`CREATE TABLE shipments (order_id TEXT NOT NULL)`); err != nil {
			log.Fatal(err)
		}
	}
	// The service's own database keeps what no tenant's may take.
	own, err := sqlitestore.Open(ctx, filepath.Join(dir, "shipping.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer own.DB().Close()
	if _, err := pipeline.Migrate(ctx, own); err != nil {
		log.Fatal(err)
	}

	broker, err := backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	sub, _ := broker.NewSubscriber("shipping")
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := middleware.AddTenantConsumerHandler(router, "shipping", "orders", sub, middleware.TenantStackConfig{
		StackConfig:     middleware.StackConfig{Consumer: "shipping"},
		Tenants:         tenants,
		QuarantineStore: own,
	}, handlers.JSON(func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES (?)`, o.ID) // in the tenant's database
		return err
	})); err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()

	for _, o := range []struct{ tenant, id string }{{"acme", "o-1"}, {"acme", "o-2"}, {"globex", "o-1"}, {"initech", "o-1"}} {
		msg, _ := pipeline.NewJSONEvent("OrderPlaced", o.id, OrderPlaced{ID: o.id})
		outboxkit.SetTenant(msg, o.tenant)
		_ = broker.Publisher.Publish("orders", msg)
	}
	for tenant, want := range map[string]int64{"acme": 2, "globex": 1} {
		st, _ := tenants.TenantStore(ctx, tenant)
		awaitStats(st, "shipping", func(s middleware.ConsumerStats) bool { return s.Processed == want })
	}
	s := awaitStats(own, "shipping", func(s middleware.ConsumerStats) bool { return s.DeadLetters == 1 })
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	for _, tenant := range []string{"acme", "globex"} {
		st, _ := tenants.TenantStore(context.Background(), tenant)
		var shipments int
		_ = st.(*store.DB).SQL.QueryRow(`SELECT count(*) FROM shipments`).Scan(&shipments)
		fmt.Printf("shipments of %s: %d\n", tenant, shipments)
	}
	letters, _ := own.InboxDeadLetters(context.Background(), store.DeadLetterFilter{Consumer: "shipping"})
	fmt.Printf("dead letters in the service's database: %d\n%s\n", s.DeadLetters, letters[0].Reason)
	// Output:
	// shipments of acme: 2
	// shipments of globex: 1
	// dead letters in the service's database: 1
	// permanent: unknown tenant "initech": no tenant's database takes its messages; it was applied in none
}
