// Package natsbackend is outboxkit's NATS JetStream broker: a stream per topic with duplicate
// detection by message id, a durable consumer per consumer group. It registers nats:// and tls://
// with backends.Open.
package natsbackend

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// natsStream names the stream of a topic: stream names cannot hold '.', which topics often do.
func natsStream(topic string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(topic)
}

// DefaultNATSAckWait is how long JetStream waits for a consumer's ack before it redelivers: the
// delay before messages stranded by a lost connection or a dead consumer come back. Held messages
// are kept alive with in-progress acks, so a slow handler is never redelivered behind its back.
const DefaultNATSAckWait = 10 * time.Second

func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	if opts.DuplicateWindow == 0 {
		opts.DuplicateWindow = 2 * time.Minute
	}
	if opts.AckWait == 0 {
		opts.AckWait = DefaultNATSAckWait
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = backends.DefaultPrefetch
	}
	// A connection that cannot be made at once keeps trying in the background (as a lost one
	// does): a process starts while its broker is down.
	connect := func(name string) (*nats.Conn, error) {
		return nats.Connect(rawURL, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
			nats.Timeout(5*time.Second), nats.RetryOnFailedConnect(true))
	}
	// Streams keep every message (limits retention) so that each consumer group reads all of them
	// through its own durable consumer, and drop a message id seen within DuplicateWindow.
	streamConfig := func(topic string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: natsStream(topic), Subjects: []string{topic}, Storage: jetstream.FileStorage,
			Retention: jetstream.LimitsPolicy, Duplicates: opts.DuplicateWindow,
		}
	}
	pub := &natsPublisher{wire: brokerio.NewWire(opts), connect: func() (jetstream.JetStream, error) {
		nc, err := connect("outboxkit-publisher")
		if err != nil {
			return nil, err
		}
		return jetstream.New(nc)
	}, streamConfig: streamConfig, ensured: map[string]bool{}}
	lag := &natsLag{connect: connect}
	return backends.Parts{
		Publisher: pub,
		Lag:       lag.read,
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			conn, err := connect("outboxkit-" + group)
			if err != nil {
				return nil, err
			}
			js, err := jetstream.New(conn)
			if err != nil {
				conn.Close()
				return nil, err
			}
			unacked := max(opts.Unacked, 1)
			sub := &natsSubscriber{conn: conn, js: js, group: group, streamConfig: streamConfig, ackWait: opts.AckWait,
				batch: max(opts.Prefetch, unacked), unacked: unacked, logger: opts.Logger}
			return brokerio.NewRetryingSubscriber(sub, group, classifyNATS, opts.Logger), nil
		},
		Close: []func() error{pub.Close, lag.close},
	}, nil
}

// classifyNATS translates a NATS error once, at the seam: a message the server will never take is
// permanent, refused credentials are access denied, a server that cannot be reached is unreachable.
func classifyNATS(err error) error {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrInvalidMsg) {
		return outboxkit.Permanent(err) // the server will never take this message
	}
	for _, t := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrPermissionViolation} {
		if errors.Is(err, t) {
			return outboxkit.AccessDenied(err)
		}
	}
	for _, t := range []error{nats.ErrConnectionClosed, nats.ErrNoServers, nats.ErrTimeout, nats.ErrConnectionDraining,
		nats.ErrDisconnected, nats.ErrNoResponders, jetstream.ErrNoStreamResponse, context.DeadlineExceeded} {
		if errors.Is(err, t) {
			return outboxkit.Unreachable(err)
		}
	}
	return err
}

func init() {
	backends.Register(open, "nats://host:4222 (NATS JetStream)", "nats", "tls")
}
