package forwarder_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/memorybackend" // memory://; import your broker's package
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// A relay moving a committed event from the outbox to the broker. Run does the same in a loop,
// woken by writers where the store can (Postgres NOTIFY, SQLite in-process); DispatchBatch is one
// pass, for tests and tools.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	// amqp://, kafka://, nats://, redis://: the same code, another URL (and package).
	broker, err := backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	sub, err := broker.NewSubscriber("shipping")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	received, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}

	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	pub, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	msg, _ := pipeline.NewJSONEvent("OrderPlaced", "o-1", map[string]string{"id": "o-1"})
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker.Publisher})
	if err != nil {
		log.Fatal(err)
	}
	res, err := relay.DispatchBatch(ctx) // in a service: go relay.Run(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", res.Published)
	m := <-received
	m.Ack()
	fmt.Println(m.UUID == msg.UUID, string(m.Payload))
	// Output:
	// published: 1
	// true {"id":"o-1"}
}

// Publishing rows another source read — the log relay of package forwarder/pglog reads them from
// Postgres's write-ahead log — through the forwarder's path: per-key lanes, circuit, backoff,
// metrics and tracing. The caller records the outcome.
func ExampleForwarder_PublishRows() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	broker, err := backends.Open(ctx, "memory://", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: broker.Publisher})
	if err != nil {
		log.Fatal(err)
	}
	d := relay.PublishRows(ctx, []store.OutboxRow{
		{Seq: 1, UUID: "0193a1f0-0000-7000-8000-000000000001", Topic: "orders", PartitionKey: "o-1", Payload: []byte(`{}`), Metadata: []byte(`{}`)},
		{Seq: 2, UUID: "0193a1f0-0000-7000-8000-000000000002", Topic: "orders", PartitionKey: "o-1", Payload: []byte(`{}`), Metadata: []byte(`{}`)},
	})
	fmt.Println("published:", d.Published, "failed:", len(d.Failed), "circuit open:", d.CircuitOpen)
	// Output:
	// published: [1 2] failed: 0 circuit open: false
}
