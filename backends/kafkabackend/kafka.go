// Package kafkabackend is outboxkit's Kafka broker: an idempotent producer keyed by partition key
// (so one aggregate stays on one partition) and consumer groups reading from the oldest offset. It
// registers kafka:// with backends.Open:
//
//	kafka://[user:password@]host:9092[,host:9092][?tls=true&sasl=SCRAM-SHA-512]
//
// with TLS (tls, tls_ca, tls_cert, tls_key, tls_server_name) and SASL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) for managed clusters, as the README's "Kafka with TLS and SASL" describes.
// Consumers read only committed records (read_committed): the records of a transaction another
// producer aborted, or has not committed yet, are not handed out; isolation=read_uncommitted
// reads them too. Producer and consumers are franz-go clients, made from one reading of the URL.
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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	conn, err := parseKafkaURL(rawURL)
	if err != nil {
		return backends.Parts{}, err
	}
	marshaler := kafkaMarshaler{wire: brokerio.NewWire(opts)}
	var (
		pub  message.Publisher
		txn  *kafkaTxnProducer
		perr error
	)
	if conn.txn.id != "" {
		txn, perr = newKafkaTxnProducer(conn, marshaler, opts.Logger)
		pub = txn
	} else {
		pub, perr = newKafkaPublisher(conn, marshaler, opts.Logger)
	}
	if perr != nil {
		return backends.Parts{}, perr
	}
	// BoundedPublisher returns at the message context's end even for records already sent, whose
	// acknowledgement franz-go waits for; Close waits for those calls.
	bounded := &brokerio.BoundedPublisher{Publisher: pub, Classify: classifyKafka,
		Ping: func(ctx context.Context) error { return pingKafka(ctx, conn) }}
	var published message.Publisher = bounded
	if txn != nil {
		published = &kafkaTxnPublisher{BoundedPublisher: bounded, txn: txn}
	}
	klag := &kafkaLag{conn: conn}
	return backends.Parts{
		Publisher: published,
		Lag:       klag.read,
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			sub := &kafkaSubscriber{conn: conn, group: group, marshaler: marshaler,
				unacked: max(opts.Unacked, 1), instanceID: opts.KafkaInstanceID, logger: opts.Logger}
			return brokerio.NewRetryingSubscriber(sub, group, classifyKafka, opts.Logger), nil
		},
		Close: []func() error{bounded.Close, klag.close},
	}, nil
}

// Group timeouts. A member that dies is noticed after a short session timeout; a member has the
// rebalance timeout to rejoin when the group changes — and, since part of it, to finish the records
// of the partitions it gives up and commit them. Every member of a group must use these: Kafka
// takes the largest rebalance timeout of the group's members.
const (
	kafkaRebalanceTimeout = 20 * time.Second // also the time a member has to finish its messages when partitions move
	kafkaSessionTimeout   = 6 * time.Second  // Kafka's smallest default group.min.session.timeout.ms
	kafkaHeartbeat        = 2 * time.Second
)

// The broker's codes that refuse the client, and those that refuse the message for good. franz-go
// returns them from the broker's answers and, for a record larger than the producer's batch limit,
// before sending (kerr.MessageTooLarge).
var (
	kafkaDenied = []*kerr.Error{kerr.SaslAuthenticationFailed, kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed,
		kerr.GroupAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed, kerr.IllegalSaslState, kerr.UnsupportedSaslMechanism}
	kafkaPermanent = []*kerr.Error{kerr.MessageTooLarge, kerr.CorruptMessage, kerr.InvalidTopicException, kerr.InvalidRecord,
		kerr.RecordListTooLarge, kerr.InvalidRequiredAcks}
)

// classifyKafka marks the errors that mean the cluster could not take the message now
// (outboxkit.Unreachable), that refuse the client (outboxkit.AccessDenied) or the message for good
// (outboxkit.Permanent); anything else is a message error.
func classifyKafka(err error) error {
	if ke, ok := errors.AsType[*kerr.Error](err); ok {
		for _, code := range kafkaDenied {
			if ke == code {
				return outboxkit.AccessDenied(err)
			}
		}
		for _, code := range kafkaPermanent {
			if ke == code {
				return outboxkit.Permanent(err) // the message or its topic is refused, and always will be
			}
		}
		return outboxkit.Unreachable(err) // leaders moving, replicas behind, timeouts: try later
	}
	// A server certificate the client cannot verify: trying again will not help until the
	// configuration (tls_ca, tls_server_name) or the certificate changes.
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return outboxkit.AccessDenied(err)
	}
	// The client's own: a record not acknowledged in time or after its retries, a client closed,
	// lost connections and timeouts. The cluster is unreachable, not the message wrong.
	for _, t := range []error{kgo.ErrRecordTimeout, kgo.ErrRecordRetries, kgo.ErrClientClosed, kgo.ErrMaxBuffered,
		io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.EPIPE,
		context.DeadlineExceeded, context.Canceled, os.ErrDeadlineExceeded} {
		if errors.Is(err, t) {
			return outboxkit.Unreachable(err)
		}
	}
	if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); ok {
		return outboxkit.Unreachable(err)
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return outboxkit.Unreachable(err)
	}
	return err
}

func init() {
	backends.Register(open, kafkaURLUsage+" (Kafka)", "kafka")
}

// pingKafka asks the cluster whether it answers and takes the client: with a client of its own
// for each bootstrap broker in turn, until one answers, the TLS handshake and SASL authentication
// the URL asks for, then ApiVersions and a Metadata request (which a listener that wants TLS or
// SASL refuses to an unauthenticated client). A TCP connection alone would not tell: a load
// balancer or proxy in front of a broker that is down accepts it. Refused credentials and a server
// certificate that does not verify are outboxkit.AccessDenied; anything else Unreachable.
func pingKafka(ctx context.Context, conn kafkaConn) error {
	timeout := 2 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(d), 10*time.Millisecond))
	}
	var errs []error
	for _, addr := range conn.brokers {
		err := pingBroker(ctx, conn, addr, timeout)
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

func pingBroker(ctx context.Context, conn kafkaConn, addr string, timeout time.Duration) error {
	cl, err := kgo.NewClient(append(conn.kgoOpts(), kgo.SeedBrokers(addr), kgo.DialTimeout(timeout),
		kgo.RequestRetries(0), kgo.RequestTimeoutOverhead(timeout))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A topic that need not exist, so that the answer stays small on a large cluster (no topic at
	// all would ask for every one); its own error in the answer is not ours. franz-go asks
	// ApiVersions first, on the connection it opens for this request.
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr("__outboxkit_ping")
	req.Topics = append(req.Topics, t)
	_, err = req.RequestWith(ctx, cl)
	return err
}
