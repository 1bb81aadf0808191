package backends

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/internal/schemes"
	"github.com/outboxkit/outboxkit/internal/urls"
)

// DefaultCloudEventsSource is the CloudEvents source attribute unless Options.CloudEventsSource
// names another.
const DefaultCloudEventsSource = "/outboxkit"

// Options tune a backend. Each field applies to the schemes its comment names; Open rejects a
// field set for another scheme rather than ignoring it.
type Options struct {
	// Logger receives the adapters' logs. Default: slog.Default(), WARN and above. All schemes.
	Logger watermill.LoggerAdapter

	// Consumers names, per topic, the consumers that read it ("*" lists consumers that read every
	// topic). Where a consumer's copy of the messages exists only once it has subscribed —
	// RabbitMQ, whose fanout exchange drops what no bound queue takes — the publisher declares
	// each consumer's queue before it first publishes to the topic, so a consumer that subscribes
	// late (a new service, a consumer deployed after the producer) still gets everything published
	// since the producer started. The other brokers keep a topic's messages for consumers that come
	// later by themselves; there it changes nothing. Default: none. All schemes.
	Consumers map[string][]string

	// CloudEvents adds, beside Watermill's own format, each message's CloudEvents attributes in
	// the broker's binary content mode — Kafka ce_* headers and content-type, AMQP cloudEvents:*
	// application properties and content_type, NATS ce-* headers and content-type; ce_* fields and
	// metadata on Redis, a watermill-sql topic and in memory, which have no binding — so that a
	// service in any language reads what the forwarder sends with its stock CloudEvents SDK: id =
	// the UUID, type = the event type, time = the outbox row's creation, partitionkey = the
	// partition key (also Kafka's record key), traceparent/tracestate from the writer's trace.
	// Reading needs no option: a message without Watermill's UUID is read from its CloudEvents
	// attributes (or RabbitMQ's message_id). Default false. All schemes.
	CloudEvents bool
	// CloudEventsSource is the CloudEvents source attribute. Default DefaultCloudEventsSource.
	// All schemes.
	CloudEventsSource string
	// ContentType is the content type of messages whose metadata names none
	// (outboxkit.MetadataContentType; pipeline.NewJSONEvent sets application/json): RabbitMQ's
	// content_type property, CloudEvents' datacontenttype. Default: none. All schemes.
	ContentType string

	// Prefetch is how many unacknowledged messages the broker hands a consumer at once: RabbitMQ's
	// prefetch count, the size of a JetStream fetch. Default DefaultPrefetch (16). amqp, nats.
	Prefetch int
	// Unacked is how many messages a subscription hands out before the first is acknowledged:
	// set it to a batching consumer's batch size (middleware.BatchConsumer), so that its batches
	// fill. Default 1, one at a time, as Watermill's subscribers do, which a router needs for
	// per-key order. RabbitMQ and NATS JetStream take it per subscription, Redis Streams per
	// subscription (read with XREADGROUP COUNT), Kafka per partition. amqp, nats, redis, kafka.
	Unacked int
	// QuorumQueues declares the consumer groups' queues as quorum queues (replicated). Default
	// false: classic durable queues. amqp.
	QuorumQueues bool

	// DuplicateWindow is how long JetStream remembers a message id to drop a duplicate publish.
	// Default 2m. nats.
	DuplicateWindow time.Duration
	// AckWait is how long JetStream waits for the ack of a message whose consumer stopped
	// answering (a lost connection, a dead process) before it redelivers it; messages a live
	// consumer holds are kept alive with in-progress acks. Default DefaultNATSAckWait (10s). nats.
	AckWait time.Duration

	// ClaimAfter is how long an entry may stay pending with a consumer of the group that is not
	// outboxkit's (another client) before a live subscription claims it. outboxkit's subscriptions
	// keep a liveness key in Redis (renewed every second): the pending entries of one that stopped
	// or was killed are taken over within about 4 seconds, and those of one that is alive, however
	// slow, are never taken. Default 30s. redis.
	ClaimAfter time.Duration

	// KafkaInstanceID makes each subscription a static member of its Kafka consumer group (KIP-345),
	// named KafkaInstanceID + "." + the topic: name the process stably across restarts — a pod's or
	// host's name, "billing-0" — and uniquely among the group's processes. A member that restarts
	// within the group's session timeout (6s) gets its partitions back without a rebalance, so the
	// rest of the group never stops for it; a member that does not come back loses them after the
	// session timeout, as before; a closed one does not leave the group (its partitions wait for
	// it that long). Letters, digits, '.', '_' and '-'. Default "": dynamic members, and every
	// restart rebalances the group — cooperatively: only the partitions that move stop. kafka.
	KafkaInstanceID string

	// PollInterval is how often an idle subscriber looks for new rows. Default 100ms. postgres.
	PollInterval time.Duration
	// PostgresStockTableNames names a topic's tables exactly as stock watermill-sql does
	// ("watermill_<topic>", "watermill_offsets_<topic>"), so that stock watermill-sql clients read
	// and write the same topic; a topic too long for that (over 45 bytes: Postgres cuts names at
	// 63) is refused. Default false: names that would not fit keep their start and end with a hash
	// of the topic, which stock clients do not find. postgres.
	PostgresStockTableNames bool
}

// Backend is a broker opened from a URL: a Publisher for the forwarder and a subscriber per
// consumer group for the consumers, with at-least-once settings on.
type Backend struct {
	// Scheme is the URL's scheme: amqp, kafka, nats, redis, postgres or memory.
	Scheme string
	// Publisher publishes with the broker's confirms; errors that mean the broker could not be
	// reached are marked outboxkit.Unreachable.
	Publisher message.Publisher

	newSubscriber func(group string) (Subscriber, error)
	lag           func(ctx context.Context, topic, group string) (Lag, error) // nil: ErrLagUnknown
	mu            sync.Mutex
	closers       []func() error
	closed        bool
}

// Parts are what a broker's package builds for Open from a URL.
type Parts struct {
	// Publisher publishes with the broker's confirms. Required.
	Publisher message.Publisher
	// NewSubscriber returns a subscriber for one consumer (never ""). Required.
	NewSubscriber func(consumer string) (Subscriber, error)
	// Lag reads a consumer's backlog; nil when the broker cannot tell (ErrLagUnknown).
	Lag func(ctx context.Context, topic, consumer string) (Lag, error)
	// Close releases what the parts hold, the publisher included, in reverse order.
	Close []func() error
}

// Opener builds a broker's Parts from a URL of a scheme it registered; Options arrive checked,
// with Logger set.
type Opener func(ctx context.Context, rawURL string, opts Options) (Parts, error)

var registry = schemes.Registry[Opener]{
	What: "broker",
	Packages: map[string]string{
		"amqp": "backends/amqpbackend", "amqps": "backends/amqpbackend", "kafka": "backends/kafkabackend",
		"nats": "backends/natsbackend", "tls": "backends/natsbackend", "redis": "backends/redisbackend",
		"rediss": "backends/redisbackend", "postgres": "backends/postgresbackend", "postgresql": "backends/postgresbackend",
		"memory": "backends/memorybackend",
	},
	All: "backends/allbackends",
}

// Register makes a broker package's Opener available to Open for URLs of the given schemes;
// example shows the URL form in errors. Broker packages call it from init, as database/sql drivers
// do: a program opens by URL only the brokers it imports (backends/allbackends imports every one).
// It panics when a scheme is registered twice.
func Register(open Opener, example string, schemes ...string) {
	registry.Register(open, example, schemes...)
}

// Schemes lists the URL forms of the registered brokers.
func Schemes() string { return registry.Schemes() }

// NewSubscriber returns a subscriber for one consumer — the consuming service, whose name is also
// the one the middleware stack's inbox records (StackConfig.Consumer) — reading as the broker's
// consumer group of that name (RabbitMQ: the queue "<topic>_<consumer>"; Kafka: the group id;
// JetStream: the durable consumer; Redis Streams: the group): every consumer gets every message of
// a topic, and the processes of one consumer share them. It connects on first use; a first
// Subscribe while the broker is down returns a channel at once and subscribes in the background
// when the broker answers. Close it when done.
func (b *Backend) NewSubscriber(consumer string) (Subscriber, error) {
	if consumer == "" {
		return nil, errors.New("backends: a consumer group is required: name the consuming service (e.g. \"shipping\")")
	}
	return b.newSubscriber(consumer)
}

// Close closes the publisher and whatever the backend opened for it. Subscribers are closed by
// their owners.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		errs = append(errs, b.closers[i]())
	}
	return errors.Join(errs...)
}

// DefaultPrefetch is how many unacknowledged messages a consumer is handed at once.
const DefaultPrefetch = 16

// Open builds the backend a URL names. Teams swap brokers by changing the URL, nothing else.
//
// Open does not connect: the publisher dials on its first Publish and each subscriber on its first
// Subscribe, so a process starts while its broker is down (a consumer never opens a publisher's
// connection it does not use). A malformed URL or option fails here.
func Open(ctx context.Context, rawURL string, opts Options) (*Backend, error) {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("broker URL %q has no scheme: use one of %s", redact(rawURL), Schemes())
	}
	scheme = strings.ToLower(scheme)
	if i := strings.IndexFunc(rawURL, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return nil, fmt.Errorf("broker URL %q holds a space or control character at byte %d: a URL names one broker, "+
			"with nothing after it (escape a space inside a value as %%20)", redact(rawURL), i)
	}
	if _, err := url.Parse(rawURL); err != nil {
		return nil, fmt.Errorf("broker URL %q is not a valid URL: %w", redact(rawURL), errors.Unwrap(err))
	}
	open, err := registry.Lookup(scheme)
	if err != nil {
		return nil, err
	}
	if err := opts.check(scheme); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = logs.Default()
	}
	parts, err := open(ctx, rawURL, opts)
	if err != nil {
		return nil, fmt.Errorf("open %s broker %s: %w", scheme, redact(rawURL), err)
	}
	return &Backend{Scheme: scheme, Publisher: parts.Publisher, newSubscriber: parts.NewSubscriber, lag: parts.Lag,
		closers: parts.Close}, nil
}

// redact hides the password of a URL for error messages.
func redact(raw string) string { return urls.Redact(raw) }

// check rejects options set for a scheme they do not apply to.
func (o Options) check(scheme string) error {
	family := map[string]string{"amqps": "amqp", "tls": "nats", "rediss": "redis", "postgresql": "postgres"}[scheme]
	if family == "" {
		family = scheme
	}
	var wrong []string
	set := func(name string, isSet bool, applies ...string) {
		if isSet && !slices.Contains(applies, family) {
			wrong = append(wrong, fmt.Sprintf("%s applies to %s:// only", name, strings.Join(applies, ":// and ")))
		}
	}
	set("Prefetch", o.Prefetch != 0, "amqp", "nats")
	set("Unacked", o.Unacked != 0, "amqp", "nats", "redis", "kafka")
	set("QuorumQueues", o.QuorumQueues, "amqp")
	set("DuplicateWindow", o.DuplicateWindow != 0, "nats")
	set("AckWait", o.AckWait != 0, "nats")
	set("ClaimAfter", o.ClaimAfter != 0, "redis")
	set("KafkaInstanceID", o.KafkaInstanceID != "", "kafka")
	set("PollInterval", o.PollInterval != 0, "postgres")
	set("PostgresStockTableNames", o.PostgresStockTableNames, "postgres")
	if len(wrong) > 0 {
		return fmt.Errorf("options that do not apply to %s://: %s", scheme, strings.Join(wrong, "; "))
	}
	if o.Prefetch < 0 || o.Unacked < 0 || o.DuplicateWindow < 0 || o.AckWait < 0 || o.ClaimAfter < 0 || o.PollInterval < 0 {
		return errors.New("options must not be negative")
	}
	if o.KafkaInstanceID != "" && !kafkaInstanceID.MatchString(o.KafkaInstanceID) {
		return fmt.Errorf("options: KafkaInstanceID %q: use letters, digits, '.', '_' and '-', at most 100 characters "+
			"(a pod's or host's name, e.g. \"billing-0\")", o.KafkaInstanceID)
	}
	for topic, consumers := range o.Consumers {
		for _, c := range consumers {
			if c == "" {
				return fmt.Errorf("options: Consumers[%q] holds an empty consumer name", topic)
			}
		}
	}
	return nil
}

// kafkaInstanceID is what Kafka takes in a group.instance.id, leaving room for the topic.
var kafkaInstanceID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
