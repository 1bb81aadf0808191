package kafkabackend_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/kafkabackend" // registers kafka://
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// A managed cluster's listener (Amazon MSK, Confluent Cloud, Aiven, Redpanda Cloud) takes TLS and
// SASL: say both in the URL. The password is percent-encoded; tls_ca is needed only when the
// cluster's certificate is not signed by a CA the system trusts.
func Example_tlsAndSASL() {
	u := url.URL{
		Scheme:   "kafka",
		User:     url.UserPassword("orders-service", "p@ss:word"), // from the service's secrets
		Host:     "b-1.kafka.internal:9096,b-2.kafka.internal:9096",
		RawQuery: url.Values{"tls": {"true"}, "sasl": {"SCRAM-SHA-512"}}.Encode(),
	}
	broker, err := backends.Open(context.Background(), u.String(), backends.Options{})
	if err != nil {
		log.Fatal(err) // a malformed URL, an unknown mechanism, a tls_ca that does not load
	}
	defer broker.Close()
	fmt.Println(broker.Scheme)
	// Output: kafka
}

// The transactional relay: with transactional_id on the URL, every pass of the forwarder is one
// Kafka transaction that carries the relay's progress, so that consumers at read_committed (the
// default of this backend's subscribers, and of Kafka Streams under exactly-once) read each event
// once however the relay dies. One transactional id per outbox; TransactionInterval trades a little
// latency for fewer transactions. Nothing dials until the relay runs.
func Example_transactionalRelay() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	outbox, err := sqlitestore.Open(ctx, filepath.Join(dir, "orders.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer outbox.DB().Close()
	broker, err := backends.Open(ctx, "kafka://127.0.0.1:9092?transactional_id=orders-relay", backends.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	_, transactional := broker.Publisher.(forwarder.TransactionalPublisher)
	fmt.Println("transactional:", transactional)

	relay, err := forwarder.New(forwarder.Config{Store: outbox, Publisher: broker.Publisher, Name: "orders",
		TransactionInterval: 20 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	_ = relay // relay.Run(ctx) relays; an error marked outboxkit.IsFenced means another relay of the group took over
	// Output: transactional: true
}
