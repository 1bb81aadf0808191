package kafkabackend

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// kafkaConn is how a kafka:// URL reaches its cluster: the bootstrap brokers, TLS and SASL. Every
// client the backend makes — the producer and its ping, the group members, topic creation and the
// lag reader, all franz-go's — is made from its kgoOpts, so they all speak to the cluster the same
// way.
type kafkaConn struct {
	brokers []string
	tls     *tls.Config // nil: plaintext
	// mechanism is the SASL mechanism (kafkaMechanisms), "" for none; user and password its
	// credentials, from the URL's user information.
	mechanism      string
	user, password string
	// readUncommitted: consumers read records of transactions not yet committed, and of aborted
	// ones (isolation=read_uncommitted); by default they read only what was committed.
	readUncommitted bool
	// txn is the producer's transactions (transactional_id and what goes with it); its id is ""
	// when the producer is idempotent only.
	txn kafkaTxnConfig
}

// kafkaTxnConfig is a transactional producer's configuration, from a kafka:// URL.
type kafkaTxnConfig struct {
	id            string        // transactional_id: one per relay group (one outbox's relays)
	progressTopic string        // progress_topic: where each transaction records the relay's progress
	timeout       time.Duration // transaction_timeout: the broker aborts a transaction left open this long
}

// The SASL mechanisms a kafka:// URL can name with ?sasl=: those of managed Kafka services
// (Confluent Cloud: PLAIN; Amazon MSK, Aiven, Redpanda: SCRAM) that take a user and a password.
const (
	saslPlain     = "PLAIN"
	saslScram256  = "SCRAM-SHA-256"
	saslScram512  = "SCRAM-SHA-512"
	kafkaURLUsage = "kafka://[user:password@]host:9092[,host:9092][?tls=true&sasl=SCRAM-SHA-512]"
)

var kafkaMechanisms = []string{saslPlain, saslScram256, saslScram512}

// kafkaParams are the query parameters a kafka:// URL takes.
var kafkaParams = []string{"tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "sasl", "isolation",
	"transactional_id", "progress_topic", "transaction_timeout"}

// parseKafkaURL reads a kafka:// URL:
//
//	kafka://host:9092[,host:9092]                      plaintext, no authentication
//	kafka://host:9093?tls=true                         TLS, the server checked against the system's roots
//	  &tls_ca=/etc/kafka/ca.pem                        ... or against these PEM certificates
//	  &tls_cert=client.pem&tls_key=client-key.pem      ... presenting a client certificate (mutual TLS)
//	  &tls_server_name=kafka.internal                  ... expecting this name in the server's certificate
//	kafka://user:password@host:9093?tls=true&sasl=SCRAM-SHA-512
//	                                                   SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
//	kafka://host:9092?isolation=read_uncommitted       consumers read records of open and aborted
//	                                                   transactions too (default: read_committed)
//	kafka://host:9092?transactional_id=orders-relay    the producer publishes in transactions (see
//	  &progress_topic=orders-relay.progress            transactionalPublisher); the topic defaults to
//	  &transaction_timeout=30s                         outboxkit.progress.<transactional_id>
//
// The user and password are percent-encoded, as in any URL. Any tls_* parameter turns TLS on.
// Whatever cannot work is refused here, with what to write instead: an unknown parameter, a
// mechanism without credentials or credentials without a mechanism, PLAIN in the clear, a
// certificate file that does not load.
func parseKafkaURL(raw string) (kafkaConn, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return kafkaConn{}, fmt.Errorf("%w: use %s", err, kafkaURLUsage)
	}
	var k kafkaConn
	for _, h := range strings.Split(u.Host, ",") {
		if h = strings.TrimSpace(h); h != "" {
			if !strings.Contains(h, ":") {
				return kafkaConn{}, fmt.Errorf("broker %q has no port: use %s", h, kafkaURLUsage)
			}
			k.brokers = append(k.brokers, h)
		}
	}
	if len(k.brokers) == 0 {
		return kafkaConn{}, fmt.Errorf("no broker address: use %s", kafkaURLUsage)
	}
	q := u.Query()
	for name := range q {
		if !slices.Contains(kafkaParams, name) {
			return kafkaConn{}, fmt.Errorf("unknown parameter %q: a kafka:// URL takes %s", name, strings.Join(kafkaParams, ", "))
		}
	}
	if k.tls, err = kafkaTLS(q); err != nil {
		return kafkaConn{}, err
	}
	if m := q.Get("sasl"); m != "" {
		k.mechanism = strings.ToUpper(m)
		if !slices.Contains(kafkaMechanisms, k.mechanism) {
			return kafkaConn{}, fmt.Errorf("sasl=%s: the mechanisms are %s", m, strings.Join(kafkaMechanisms, ", "))
		}
	}
	switch iso := q.Get("isolation"); iso {
	case "", "read_committed":
	case "read_uncommitted":
		k.readUncommitted = true
	default:
		return kafkaConn{}, fmt.Errorf("isolation=%s: use isolation=read_committed (the default) or isolation=read_uncommitted", iso)
	}
	if k.txn, err = parseKafkaTxn(q); err != nil {
		return kafkaConn{}, err
	}
	if u.User != nil {
		k.user = u.User.Username()
		k.password, _ = u.User.Password()
	}
	switch {
	case k.mechanism == "" && u.User != nil:
		return kafkaConn{}, fmt.Errorf("the URL names a user but no SASL mechanism: add sasl=%s to its query (the mechanism your cluster's listener takes)",
			strings.Join(kafkaMechanisms, ", sasl="))
	case k.mechanism != "" && (k.user == "" || k.password == ""):
		return kafkaConn{}, fmt.Errorf("sasl=%s needs a user and a password: write them in the URL, kafka://user:password@host:9092 (percent-encoded)", k.mechanism)
	case k.mechanism == saslPlain && k.tls == nil:
		// PLAIN sends the password as it is: only over TLS.
		return kafkaConn{}, errors.New("sasl=PLAIN would send the password in the clear: add tls=true (PLAIN listeners are TLS ones)")
	}
	return k, nil
}

// kafkaTLS is the TLS configuration the URL's tls* parameters ask for, nil for plaintext.
func kafkaTLS(q url.Values) (*tls.Config, error) {
	on := false
	if v := q.Get("tls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("tls=%s: use tls=true or tls=false", v)
		}
		on = b
	}
	ca, cert, key, name := q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key"), q.Get("tls_server_name")
	if ca+cert+key+name != "" {
		if q.Get("tls") != "" && !on {
			return nil, errors.New("tls=false with tls_* parameters: remove tls=false, or the tls_* parameters")
		}
		on = true
	}
	if !on {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca: %s holds no PEM certificate", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("a client certificate needs both tls_cert and tls_key (PEM files)")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("tls_cert, tls_key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// isolation is the level the URL's consumers read at.
func (k kafkaConn) isolation() kgo.IsolationLevel {
	if k.readUncommitted {
		return kgo.ReadUncommitted()
	}
	return kgo.ReadCommitted()
}

// kgoOpts are the franz-go options every client of the backend is made with.
func (k kafkaConn) kgoOpts() []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(k.brokers...), kgo.ClientID("outboxkit"), kgo.DialTimeout(5 * time.Second)}
	if k.tls != nil {
		opts = append(opts, kgo.DialTLSConfig(k.tls.Clone()))
	}
	if m := k.kgoMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

func (k kafkaConn) kgoMechanism() sasl.Mechanism {
	switch k.mechanism {
	case saslPlain:
		return plain.Auth{User: k.user, Pass: k.password}.AsMechanism()
	case saslScram256:
		return scram.Auth{User: k.user, Pass: k.password}.AsSha256Mechanism()
	case saslScram512:
		return scram.Auth{User: k.user, Pass: k.password}.AsSha512Mechanism()
	}
	return nil
}

// explain adds to an error that a broker closed the connection at once what the URL did not ask
// for: a listener that wants TLS or SASL closes the connection of a plaintext, unauthenticated
// client as soon as it speaks — as does a proxy or load balancer whose broker is down, so the error
// keeps its class (outboxkit.Unreachable) and says both.
func (k kafkaConn) explain(err error) error {
	if err == nil || !closedAtOnce(err) {
		return err
	}
	var missing []string
	if k.tls == nil {
		missing = append(missing, "TLS (add tls=true to the URL)")
	}
	if k.mechanism == "" {
		missing = append(missing, "SASL (add sasl=<mechanism> and user:password@ to the URL)")
	}
	if len(missing) == 0 {
		return err
	}
	return fmt.Errorf("%w (the broker closed the connection as soon as the client spoke: either it is down behind a proxy or "+
		"load balancer, or its listener requires %s, which this URL does not ask for)", err, strings.Join(missing, " or "))
}

// closedAtOnce reports whether err is a connection closed by the server before it answered.
func closedAtOnce(err error) bool {
	if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); ok {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// parseKafkaTxn reads the transactional parameters of a kafka:// URL.
func parseKafkaTxn(q url.Values) (kafkaTxnConfig, error) {
	c := kafkaTxnConfig{id: q.Get("transactional_id"), progressTopic: q.Get("progress_topic"), timeout: kafkaTxnTimeout}
	if c.id == "" {
		if q.Has("progress_topic") || q.Has("transaction_timeout") {
			return kafkaTxnConfig{}, errors.New("progress_topic and transaction_timeout configure transactions: add transactional_id=<relay group> to the URL")
		}
		return c, nil
	}
	if c.progressTopic == "" {
		c.progressTopic = "outboxkit.progress." + c.id
	}
	if v := q.Get("transaction_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > 15*time.Minute {
			return kafkaTxnConfig{}, fmt.Errorf("transaction_timeout=%s: give a duration from 1s to 15m (Kafka's transaction.max.timeout.ms), such as 30s", v)
		}
		c.timeout = d
	}
	return c, nil
}
