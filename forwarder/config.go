package forwarder

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultName           = "default"
	DefaultBatchSize      = 500
	DefaultMaxInFlight    = 64
	DefaultPollInterval   = time.Second
	DefaultMaxAttempts    = 10
	DefaultPublishTimeout = 10 * time.Second

	// DefaultPollIntervalWithoutWake is the poll of a store whose writers do not wake relays
	// (MySQL, Postgres without LISTEN): one probe of the pending rows' index each time.
	DefaultPollIntervalWithoutWake = 100 * time.Millisecond

	// DefaultCircuitWatch is how often an open circuit asks the broker whether it answers again.
	DefaultCircuitWatch = 250 * time.Millisecond

	// DefaultAwakePoll is the poll of a relay kept awake by traffic, while writers do not wake it.
	DefaultAwakePoll = 5 * time.Millisecond
	// DefaultAwakeFor is how long a busy relay tells writers it is awake, renewed while busy.
	DefaultAwakeFor = time.Second
	// DefaultAwakeAbove is the commit rate, in rows a second, above which a relay stays awake.
	DefaultAwakeAbove = 500
)

// DefaultBackoff spaces the attempts of a message that failed: 1s, 2s, 4s … capped at 5 minutes,
// each ±20%.
var DefaultBackoff = Backoff{Initial: time.Second, Max: 5 * time.Minute, Multiplier: 2, Jitter: 0.2}

// DefaultCircuitBackoff spaces the probes of a broker that could not be reached, where the
// publisher cannot Check it, and of a broker that refused the relay's credentials: 1s, 2s, 4s …
// capped at 30 seconds, each ±20%.
var DefaultCircuitBackoff = Backoff{Initial: time.Second, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2}

// DefaultRetention deletes published rows a day after publication, checking every minute, at most
// 1,000 rows per statement.
var DefaultRetention = Retention{Age: 24 * time.Hour, Interval: time.Minute, BatchSize: 1000}

// Config configures a Forwarder. Zero-valued fields take the documented defaults; New rejects
// values that cannot work and names the field.
type Config struct {
	// Store holds the outbox: store/pgxstore, pgsqlstore, mysqlstore, sqlitestore, or
	// store.Open. Required. Where its writers wake relays (Postgres NOTIFY, SQLite in-process),
	// the forwarder listens; it polls as well, always.
	Store store.Store

	// Publisher receives the messages: any Watermill publisher, typically one from backends.
	// Required. It is called from up to MaxInFlight goroutines at once, one message per call.
	Publisher message.Publisher

	// Name identifies this forwarder in logs and metrics labels. Default "default".
	Name string

	// BatchSize is the most rows one pass claims. Default 500.
	BatchSize int

	// MaxInFlight is the most partition keys published concurrently within a pass. Rows of one key
	// are always published one after another, in order. Default 64.
	MaxInFlight int

	// PollInterval is the time between passes when no writer wakes the relay: the safety net
	// under wake-ups, or the only trigger for a store without them. Each wait is jittered by ±10%.
	// Default DefaultPollInterval (1s), or DefaultPollIntervalWithoutWake (100ms) for a store
	// whose writers do not wake relays.
	PollInterval time.Duration

	// IdlePollInterval lets an idle relay poll less and less: after each pass that finds nothing,
	// the wait before the next doubles, from PollInterval up to IdlePollInterval (each jittered by
	// ±10%), so that an outbox nobody writes to costs next to nothing. A pass that claims rows, or
	// a writer's wake-up, brings the wait back to PollInterval. Where writers wake relays the
	// wake-up comes at once however long the wait; where they do not, a row waits for the next
	// poll: up to IdlePollInterval. It must be at least PollInterval. Default 0: every wait is
	// PollInterval.
	IdlePollInterval time.Duration

	// AwakePoll is the poll of a relay that traffic keeps awake, where the store lets writers skip
	// the wake-up meanwhile (Postgres, whose NOTIFY serialises the writers' commits, which costs
	// more than the row itself under many writers). A relay becomes awake while it relays more
	// than AwakeAbove rows a second: it tells writers so for AwakeFor (renewed while busy), polls
	// every AwakePoll, and goes back to being woken once the rate drops and AwakeFor has run out.
	// Below that rate each commit wakes it, which is faster than any poll. Default
	// DefaultAwakePoll (5ms). DisableAwake keeps writers waking it every time.
	AwakePoll time.Duration
	// AwakeAbove: see AwakePoll. Default DefaultAwakeAbove (500 rows a second).
	AwakeAbove int
	// AwakeFor: see AwakePoll. Default DefaultAwakeFor (1s).
	AwakeFor time.Duration
	// DisableAwake: see AwakePoll. Default false.
	DisableAwake bool

	// MaxAttempts is how many message-specific failures a row may have before it is dead-lettered.
	// Failures to reach the broker never count. Default 10.
	MaxAttempts int

	// Backoff spaces the attempts of a row after a message-specific failure. Default DefaultBackoff.
	Backoff Backoff

	// CircuitWatch is how often the relay asks an unreachable broker whether it answers again,
	// while the circuit is open: the publisher's Check (every backend has one: a dial, a PING, a
	// metadata request), which publishes nothing and counts no attempt. As soon as the broker
	// answers, the next pass publishes one row and, when it gets through, the rest: publishing
	// resumes within about CircuitWatch of the broker's return, however long it was away.
	// Default DefaultCircuitWatch (250ms).
	CircuitWatch time.Duration

	// CircuitBackoff spaces the probes (one row) while the broker cannot be reached, where the
	// Publisher has no Check method (Check(ctx) error) to watch it with, and while the broker
	// refuses the relay's credentials. Default DefaultCircuitBackoff.
	CircuitBackoff Backoff

	// TransactionInterval spaces the transactions of a relay whose Publisher is a
	// TransactionalPublisher: a pass that published rows and found no full batch waits until
	// TransactionInterval after its start before the next pass begins, however soon writers wake
	// it, so that rows committed meanwhile go in one transaction. Each transaction costs the
	// broker a commit — a marker written to every partition it touched, which read_committed
	// consumers wait for — so a longer interval means fewer, larger transactions and fewer
	// markers, at the price of up to TransactionInterval more from the writer's commit to the
	// moment a read_committed consumer can see the row. A backlog (full passes) goes back to back
	// regardless. Ignored without a transactional publisher. Default 0: a pass runs as soon as
	// writers wake the relay.
	TransactionInterval time.Duration

	// PublishTimeout bounds the publishing phase of one pass, confirms included, and so how long
	// claimed rows stay locked. A publish still waiting when it ends counts as the broker unreachable.
	// Default 10s.
	PublishTimeout time.Duration

	// ParkKeyOnDeadLetter keeps later rows of a key waiting while an earlier row of that key is
	// dead-lettered, until an operator replays it: strict per-key order at the price of a stalled
	// key. Default false: a dead-lettered row no longer holds its key back.
	ParkKeyOnDeadLetter bool

	// TopicMapping maps an outbox row's topic and partition key ("" when it has none) to the broker
	// topic, e.g. to spread a topic over key shards with outboxkit.ShardTopic. Default: the same
	// topic.
	TopicMapping func(topic, partitionKey string) string

	// IsUnreachable decides whether a publish error means "broker unreachable" (open the circuit,
	// do not count the attempt) rather than "this message failed". Default outboxkit.IsUnreachable.
	IsUnreachable func(error) bool

	// HeartbeatInterval is how often a running relay reads the pauses an operator set (package
	// console) and reports its state: a pause set in the middle of a pass is honoured from the next
	// row once read. Default DefaultHeartbeatInterval (2s).
	HeartbeatInterval time.Duration

	// Retention deletes published rows. Default DefaultRetention.
	Retention Retention

	// Now is the clock for backoff, retention and ages. Default time.Now.
	Now func() time.Time

	// Logger receives the forwarder's logs. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter

	// Metrics receives what the forwarder does: prom.NewForwarderMetrics(registerer) exports it to
	// Prometheus. Default: none.
	Metrics Metrics

	// TracerProvider makes one span per publish, linked to the trace of the transaction that wrote
	// the row (stored in its metadata). Default: no spans. otel.GetTracerProvider() is the
	// application's global one.
	TracerProvider trace.TracerProvider
}

// Retention says what happens to published rows.
type Retention struct {
	// Age after which published rows are deleted. Default 24h.
	Age time.Duration
	// Interval between retention runs while Run is running. Default 1m.
	Interval time.Duration
	// BatchSize bounds the rows one DELETE statement removes, so retention never holds long locks.
	// Default 1000.
	BatchSize int
	// DeleteOnPublish deletes rows in the pass that publishes them instead of marking them; nothing
	// is kept for inspection. Default false.
	DeleteOnPublish bool
	// Keep disables retention: published rows stay until something else removes them.
	// Default false.
	Keep bool
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
		if c.Store != nil && c.Store.Waker() == nil {
			c.PollInterval = DefaultPollIntervalWithoutWake
		}
	}
	if c.AwakePoll == 0 {
		c.AwakePoll = DefaultAwakePoll
	}
	if c.AwakeFor == 0 {
		c.AwakeFor = DefaultAwakeFor
	}
	if c.AwakeAbove == 0 {
		c.AwakeAbove = DefaultAwakeAbove
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Backoff == (Backoff{}) {
		c.Backoff = DefaultBackoff
	}
	if c.CircuitBackoff == (Backoff{}) {
		c.CircuitBackoff = DefaultCircuitBackoff
	}
	if c.CircuitWatch == 0 {
		c.CircuitWatch = DefaultCircuitWatch
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.TopicMapping == nil {
		c.TopicMapping = func(topic, _ string) string { return topic }
	}
	if c.IsUnreachable == nil {
		c.IsUnreachable = outboxkit.IsUnreachable
	}
	if c.Retention.Age == 0 {
		c.Retention.Age = DefaultRetention.Age
	}
	if c.Retention.Interval == 0 {
		c.Retention.Interval = DefaultRetention.Interval
	}
	if c.Retention.BatchSize == 0 {
		c.Retention.BatchSize = DefaultRetention.BatchSize
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("field Store is required: pass the store of the database holding the outbox "+
			"(store/pgxstore, pgsqlstore, mysqlstore, sqlitestore, or store.Open)"))
	}
	if c.Publisher == nil {
		errs = append(errs, errors.New("field Publisher is required: pass the broker publisher (see package backends)"))
	}
	positive := func(field string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", field, v))
		}
	}
	positive("BatchSize", c.BatchSize)
	positive("MaxInFlight", c.MaxInFlight)
	positive("MaxAttempts", c.MaxAttempts)
	positive("Retention.BatchSize", c.Retention.BatchSize)
	positiveDur := func(field string, v time.Duration) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", field, v))
		}
	}
	positiveDur("PollInterval", c.PollInterval)
	if c.TransactionInterval < 0 {
		errs = append(errs, fmt.Errorf("TransactionInterval must be 0 (off) or positive, got %s", c.TransactionInterval))
	}
	if c.IdlePollInterval != 0 && c.IdlePollInterval < c.PollInterval {
		errs = append(errs, fmt.Errorf("IdlePollInterval must be 0 (off) or at least PollInterval (%s), got %s",
			c.PollInterval, c.IdlePollInterval))
	}
	positiveDur("AwakePoll", c.AwakePoll)
	positiveDur("AwakeFor", c.AwakeFor)
	positive("AwakeAbove", c.AwakeAbove)
	positiveDur("PublishTimeout", c.PublishTimeout)
	positiveDur("CircuitWatch", c.CircuitWatch)
	positiveDur("HeartbeatInterval", c.HeartbeatInterval)
	positiveDur("Retention.Age", c.Retention.Age)
	positiveDur("Retention.Interval", c.Retention.Interval)
	errs = append(errs, c.Backoff.Validate("Backoff"), c.CircuitBackoff.Validate("CircuitBackoff"))
	if c.Retention.Keep && c.Retention.DeleteOnPublish {
		errs = append(errs, errors.New("fields Retention.Keep and Retention.DeleteOnPublish contradict each other: choose one"))
	}
	return errors.Join(errs...)
}
