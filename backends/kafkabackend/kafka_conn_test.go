package kafkabackend

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/backends"
)

// The tests that dial a broker — TLS and SASL against an in-process kfake — are in
// integration/kafkabackend: kfake is a requirement of the integration module, not of the library's.

func TestParseKafkaURL_RefusesWhatCannotWorkAndSaysWhatToWrite(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, want string }{
		{"kafka://broker", `broker "broker" has no port: use kafka://`},
		{"kafka://", "no broker address: use kafka://"},
		{"kafka://h:9092?sasl_mechanism=PLAIN", `unknown parameter "sasl_mechanism": a kafka:// URL takes tls, tls_ca`},
		{"kafka://h:9092?tls=yes please", "tls=yes please: use tls=true or tls=false"},
		{"kafka://h:9092?tls=false&tls_ca=/x", "tls=false with tls_* parameters"},
		{"kafka://u:p@h:9092?tls=true&sasl=GSSAPI", "sasl=GSSAPI: the mechanisms are PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"},
		{"kafka://u:p@h:9092?tls=true", "the URL names a user but no SASL mechanism: add sasl=PLAIN, sasl=SCRAM-SHA-256, sasl=SCRAM-SHA-512"},
		{"kafka://h:9092?sasl=SCRAM-SHA-512", "sasl=SCRAM-SHA-512 needs a user and a password: write them in the URL"},
		{"kafka://u@h:9092?sasl=scram-sha-256", "sasl=SCRAM-SHA-256 needs a user and a password"},
		{"kafka://u:p@h:9092?sasl=PLAIN", "sasl=PLAIN would send the password in the clear: add tls=true"},
		{"kafka://h:9092?tls_ca=" + filepath.Join(dir, "missing.pem"), "tls_ca: open " + filepath.Join(dir, "missing.pem")},
		{"kafka://h:9092?tls_ca=" + notPEM, "tls_ca: " + notPEM + " holds no PEM certificate"},
		{"kafka://h:9092?tls_cert=" + notPEM, "a client certificate needs both tls_cert and tls_key"},
		{"kafka://h:9092?tls_cert=" + notPEM + "&tls_key=" + notPEM, "tls_cert, tls_key: "},
		{"kafka://h:9092?isolation=committed", "isolation=committed: use isolation=read_committed (the default) or isolation=read_uncommitted"},
		{"kafka://h:9092?progress_topic=p", "progress_topic and transaction_timeout configure transactions: add transactional_id=<relay group>"},
		{"kafka://h:9092?transactional_id=r&transaction_timeout=5", "transaction_timeout=5: give a duration from 1s to 15m"},
		{"kafka://h:9092?transactional_id=r&transaction_timeout=1h", "transaction_timeout=1h: give a duration from 1s to 15m"},
	} {
		_, err := parseKafkaURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v; want one holding %q", tc.url, err, tc.want)
		}
	}
	// Open says it too, with the password hidden.
	_, err := backends.Open(context.Background(), "kafka://app:hunter2@h:9092?tls=true", backends.Options{})
	if err == nil || !strings.Contains(err.Error(), "add sasl=") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Open = %v; want the missing mechanism named and the password hidden", err)
	}

	for url, uncommitted := range map[string]bool{"kafka://h:9092": false, "kafka://h:9092?isolation=read_committed": false,
		"kafka://h:9092?isolation=read_uncommitted": true} {
		if k, err := parseKafkaURL(url); err != nil || k.readUncommitted != uncommitted || (k.isolation() == kgo.ReadCommitted()) == uncommitted {
			t.Errorf("%s: read uncommitted %v (%v); want %v", url, k.readUncommitted, err, uncommitted)
		}
	}

	for url, want := range map[string]kafkaTxnConfig{
		"kafka://h:9092":                    {timeout: kafkaTxnTimeout},
		"kafka://h:9092?transactional_id=r": {id: "r", progressTopic: "outboxkit.progress.r", timeout: kafkaTxnTimeout},
		"kafka://h:9092?transactional_id=r&progress_topic=p&transaction_timeout=30s": {id: "r", progressTopic: "p", timeout: 30 * time.Second},
	} {
		if k, err := parseKafkaURL(url); err != nil || k.txn != want {
			t.Errorf("%s: transactions %+v (%v); want %+v", url, k.txn, err, want)
		}
	}

	for _, tc := range []struct {
		url       string
		brokers   []string
		tls       bool
		mechanism string
		user      string
		password  string
	}{
		{"kafka://a:9092,b:9092/", []string{"a:9092", "b:9092"}, false, "", "", ""},
		{"kafka://h:9093?tls=true", []string{"h:9093"}, true, "", "", ""},
		{"kafka://h:9093?tls_server_name=kafka.internal", []string{"h:9093"}, true, "", "", ""},
		{"kafka://app:p%40ss%3Aw0rd@h:9093?tls=1&sasl=scram-sha-512", []string{"h:9093"}, true, saslScram512, "app", "p@ss:w0rd"},
		{"kafka://app:pw@h:9093?tls=true&sasl=PLAIN", []string{"h:9093"}, true, saslPlain, "app", "pw"},
		{"kafka://app:pw@h:9092?sasl=SCRAM-SHA-256", []string{"h:9092"}, false, saslScram256, "app", "pw"},
	} {
		k, err := parseKafkaURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if strings.Join(k.brokers, ",") != strings.Join(tc.brokers, ",") || (k.tls != nil) != tc.tls ||
			k.mechanism != tc.mechanism || k.user != tc.user || k.password != tc.password {
			t.Errorf("%s: read %v tls=%v %q %q %q", tc.url, k.brokers, k.tls != nil, k.mechanism, k.user, k.password)
		}
	}
}
