package integration

import (
	"context"
	"strings"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// stockTopic makes a topic's table the way stock watermill-sql does (JSON or BYTEA payload,
// VARCHAR(36) ids) in the schema url's search_path names.
func stockTopic(t *testing.T, url, topic, payloadType string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{
		SchemaAdapter:        wsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return payloadType }},
		AutoInitializeSchema: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, message.NewMessage("stock-1", []byte(`{"made":"by stock watermill-sql"}`))); err != nil {
		t.Fatal(err)
	}
}

// A topic table stock watermill-sql made with its JSON payload column would refuse, at the broker,
// the bytes the outbox accepted: publisher and subscriber refuse the topic at once, saying what to do.
func TestPostgresTopic_StockJSONTableIsRefusedWithWhatToDo(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresTopicURL(t)
	stockTopic(t, url, "orders", "JSON")
	b := openBackend(t, url, backends.Options{PostgresStockTableNames: true})
	err := b.Publisher.Publish("orders", message.NewMessage("m-1", []byte{0xff, 0x00, 0x01}))
	if err == nil || !strings.Contains(err.Error(), "json payload column") || !strings.Contains(err.Error(), "ALTER TABLE") {
		t.Fatalf("publish: %v; want a refusal naming the JSON payload column and how to convert it", err)
	}
	sub, err := b.NewSubscriber("app")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize("orders"); err == nil || !strings.Contains(err.Error(), "json payload column") {
		t.Fatalf("subscribe: %v; want the same refusal", err)
	}
}

// Ids the outbox accepts (up to 255 bytes) are accepted by the topic, a stock table's 36-character
// id column included; with stock names a stock client's table is the one used, and a topic too long
// for stock names is refused.
func TestPostgresTopic_LongIdsAndStockNames(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresTopicURL(t)
	stockTopic(t, url, "orders", "BYTEA")
	b := openBackend(t, url, backends.Options{PostgresStockTableNames: true})
	long := strings.Repeat("i", 200)
	if err := b.Publisher.Publish("orders", message.NewMessage(long, []byte("x"))); err != nil {
		t.Fatalf("a 200-byte id: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM watermill_orders`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("stock table holds %d rows (%v), want the stock client's and ours", n, err)
	}
	longTopic := strings.Repeat("t", 46)
	if err := b.Publisher.Publish(longTopic, message.NewMessage("m", nil)); err == nil || !strings.Contains(err.Error(), "too long for stock") {
		t.Fatalf("a 46-byte topic with stock names: %v; want a refusal", err)
	}
}
