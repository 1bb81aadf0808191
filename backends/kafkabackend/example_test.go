package kafkabackend_test

import (
	"context"
	"fmt"
	"log"
	"net/url"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/kafkabackend" // registers kafka://
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
