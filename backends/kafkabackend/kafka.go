// Package kafkabackend is outboxkit's Kafka broker: an idempotent producer keyed by partition key
// (so one aggregate stays on one partition) and consumer groups reading from the oldest offset. It
// registers kafka:// with backends.Open:
//
//	kafka://[user:password@]host:9092[,host:9092][?tls=true&sasl=SCRAM-SHA-512]
//
// with TLS (tls, tls_ca, tls_cert, tls_key, tls_server_name) and SASL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) for managed clusters, as the README's "Kafka with TLS and SASL" describes.
package kafkabackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	conn, err := parseKafkaURL(rawURL)
	if err != nil {
		return backends.Parts{}, err
	}
	marshaler := kafkaMarshaler{inner: kafka.NewWithPartitioningMarshaler(kafkaKey), wire: brokerio.NewWire(opts)}

	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	cfg.Producer.RequiredAcks = sarama.WaitForAll // every in-sync replica has the message
	cfg.Producer.Idempotent = true                // the broker drops the producer's own retried duplicates
	cfg.Net.MaxOpenRequests = 1                   // required by the idempotent producer
	cfg.Net.DialTimeout = 5 * time.Second         // Sarama's 30s hides an unreachable broker for long
	cfg.Version = kafkaVersion
	conn.sarama(cfg)
	// Sarama's producer dials when it is made: make it on the first publish, so a process starts
	// while the cluster is down.
	lazy := &brokerio.LazyPublisher{Build: func() (message.Publisher, error) {
		return kafka.NewPublisher(kafka.PublisherConfig{Brokers: conn.brokers, Marshaler: marshaler, OverwriteSaramaConfig: cfg}, opts.Logger)
	}}
	bounded := &brokerio.BoundedPublisher{Publisher: lazy, Classify: classifyKafka,
		Ping: func(ctx context.Context) error { return pingKafka(ctx, conn) }}
	klag := &kafkaLag{conn: conn}
	return backends.Parts{
		Publisher: bounded,
		Lag:       klag.read,
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			sub := &kafkaSubscriber{conn: conn, group: group, marshaler: marshaler,
				unacked: max(opts.Unacked, 1), instanceID: opts.KafkaInstanceID, logger: opts.Logger}
			return brokerio.NewRetryingSubscriber(sub, group, classifyKafka, opts.Logger), nil
		},
		Close: []func() error{bounded.Close, klag.close},
	}, nil
}

// kafkaVersion is the protocol version the producer and the ping speak: Kafka 2.8 (2021) or
// newer.
var kafkaVersion = sarama.V2_8_0_0

// Group timeouts. A member that dies is noticed after a short session timeout; a member has the
// rebalance timeout to rejoin when the group changes — and, since part of it, to finish the records
// of the partitions it gives up and commit them. Every member of a group must use these: Kafka
// takes the largest rebalance timeout of the group's members.
const (
	kafkaRebalanceTimeout = 20 * time.Second // also the time a member has to finish its messages when partitions move
	kafkaSessionTimeout   = 6 * time.Second  // Kafka's smallest default group.min.session.timeout.ms
	kafkaHeartbeat        = 2 * time.Second
)

// The Sarama codes that refuse the client, and those that refuse the message for good.
var (
	saramaDenied = []sarama.KError{sarama.ErrSASLAuthenticationFailed, sarama.ErrTopicAuthorizationFailed,
		sarama.ErrClusterAuthorizationFailed, sarama.ErrGroupAuthorizationFailed, sarama.ErrTransactionalIDAuthorizationFailed}
	saramaPermanent = []sarama.KError{sarama.ErrMessageSizeTooLarge, sarama.ErrInvalidMessage, sarama.ErrInvalidMessageSize,
		sarama.ErrInvalidTopic, sarama.ErrInvalidRecord}
)

// classifyKafka marks the errors that mean the cluster could not take the message now.
func classifyKafka(err error) error {
	if ke, ok := errors.AsType[*kerr.Error](err); ok { // franz-go's, from the consumer
		switch ke {
		case kerr.SaslAuthenticationFailed, kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed,
			kerr.GroupAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed:
			return outboxkit.AccessDenied(err)
		case kerr.MessageTooLarge, kerr.CorruptMessage, kerr.InvalidTopicException, kerr.InvalidRecord, kerr.RecordListTooLarge:
			return outboxkit.Permanent(err)
		}
		return outboxkit.Unreachable(err)
	}
	// A server certificate the client cannot verify: trying again will not help until the
	// configuration (tls_ca, tls_server_name) or the certificate changes.
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return outboxkit.AccessDenied(err)
	}
	if errors.Is(err, kgo.ErrClientClosed) {
		return outboxkit.Unreachable(err)
	}
	// Sarama's broker codes, matched with errors.Is: Sarama wraps some of them (a refused SASL
	// authentication, with the broker's message) so that errors.As does not find the code.
	for _, code := range saramaDenied {
		if errors.Is(err, code) {
			return outboxkit.AccessDenied(err)
		}
	}
	for _, code := range saramaPermanent {
		if errors.Is(err, code) {
			return outboxkit.Permanent(err) // the message or its topic is refused, and always will be
		}
	}
	if _, ok := errors.AsType[sarama.KError](err); ok {
		return outboxkit.Unreachable(err) // leaders moving, replicas behind, timeouts: try later
	}
	// Sarama's own circuit breaker opens after a few failed requests to a broker: the cluster is
	// unreachable, not the message wrong. So are lost connections and timeouts.
	for _, t := range []error{sarama.ErrOutOfBrokers, sarama.ErrNotConnected, sarama.ErrClosedClient,
		sarama.ErrShuttingDown, sarama.ErrControllerNotAvailable, breaker.ErrBreakerOpen,
		io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.EPIPE,
		context.DeadlineExceeded, os.ErrDeadlineExceeded} {
		if errors.Is(err, t) {
			return outboxkit.Unreachable(err)
		}
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return outboxkit.Unreachable(err)
	}
	return err
}

func init() {
	backends.Register(open, kafkaURLUsage+" (Kafka)", "kafka")
}

// pingKafka asks the cluster whether it answers and takes the client: on a connection of its own
// to each bootstrap broker in turn, until one answers, the TLS handshake and SASL authentication
// the URL asks for, then ApiVersions and a Metadata request (which a listener that
// wants TLS or SASL refuses to an unauthenticated client). A TCP connection alone would not tell:
// a load balancer or proxy in front of a broker that is down accepts it. Refused credentials and a
// server certificate that does not verify are outboxkit.AccessDenied; anything else Unreachable.
func pingKafka(ctx context.Context, conn kafkaConn) error {
	timeout := 2 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(d), 10*time.Millisecond))
	}
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = timeout, timeout, timeout
	conn.sarama(cfg)
	var errs []error
	for _, addr := range conn.brokers {
		err := pingBroker(addr, cfg)
		if err == nil {
			return nil
		}
		err = fmt.Errorf("%s: %w", addr, conn.explain(err))
		if outboxkit.IsAccessDenied(classifyKafka(err)) {
			return err // another broker of the cluster would refuse it too; Check classifies it
		}
		errs = append(errs, err)
	}
	return outboxkit.Unreachable(fmt.Errorf("no Kafka broker answered: %w", errors.Join(errs...)))
}

func pingBroker(addr string, cfg *sarama.Config) error {
	b := sarama.NewBroker(addr)
	if err := b.Open(cfg); err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	if _, err := b.ApiVersions(&sarama.ApiVersionsRequest{}); err != nil {
		return err
	}
	// A topic that need not exist, so that the answer stays small on a large cluster (no topic at
	// all would ask for every one); its own error in the answer is not ours.
	req := sarama.NewMetadataRequest(cfg.Version, []string{"__outboxkit_ping"})
	req.AllowAutoTopicCreation = false
	_, err := b.GetMetadata(req)
	return err
}
