package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// backendCase is a broker the suites run against, and what it guarantees.
type backendCase struct {
	scheme   string
	url      func(t testing.TB) string
	features tests.Features
	// shared: subscribers made without a group share one (they compete for messages), as in
	// the adapter's own suite; otherwise each gets a group of its own (every message).
	shared bool
	opts   backends.Options
}

var backendCases = []backendCase{
	{"amqp", testenv.AMQPURL, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
	}, true, backends.Options{}},
	{"kafka", testenv.KafkaURL, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: false, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
	}, false, backends.Options{}},
	// A stopped subscription nak's the message it was handling, but the up to 16 it had prefetched
	// come back only after AckWait, as with any prefetching JetStream consumer. The suite wants
	// them within 15s, so it runs with a 2s AckWait (watermill-nats's own suite uses 1s).
	{"nats", testenv.NATSURL, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: false, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
	}, false, backends.Options{AckWait: 2 * time.Second}},
	// Entries a cancelled subscription had read stay pending under its consumer; they go to a live
	// subscription within seconds, since the cancelled one no longer heartbeats (ClaimAfter, 30s,
	// is for consumers that do not).
	{"redis", testenv.RedisURL, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: false, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
	}, false, backends.Options{}},
	// Declared as watermill-sql declares its default Postgres schema: the subscriber's transaction
	// covers the ack and the offset.
	{"postgres", testenv.PostgresTopicURL, tests.Features{
		ConsumerGroups: true, ExactlyOnceDelivery: true, GuaranteedOrder: true, GuaranteedOrderWithSingleSubscriber: true,
		Persistent: true,
	}, true, backends.Options{}},
	// Declared as Watermill declares its GoChannel: one instance, nothing persisted.
	{"memory", func(testing.TB) string { return "memory://" }, tests.Features{
		ExactlyOnceDelivery: true, RequireSingleInstance: true,
	}, false, backends.Options{}},
}

// openBackend opens the backend for a test and closes it when the test ends.
func openBackend(t *testing.T, rawURL string, opts backends.Options) *backends.Backend {
	t.Helper()
	b, err := backends.Open(context.Background(), rawURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Watermill's universal Pub/Sub suite, against each backend exactly as backends.Open builds it.
func TestBackends_WatermillUniversalSuite(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.scheme, func(t *testing.T) {
			t.Parallel()
			url := bc.url(t)
			used := newTopicLog()
			used.dropWhenDone(t, bc.scheme, url) // after every test of the suite has ended
			features := bc.features
			features.ForceShort = true // the short variant: the suite's many scenarios, with fewer messages each
			features.GenerateTopicFunc = func(tctx tests.TestContext) string {
				return strings.ToLower(fmt.Sprintf("suite_%s_%s", bc.scheme, tctx.TestID))
			}
			constructor := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				b := openBackend(t, url, bc.opts) // in memory, each pair is a broker of its own
				if group == "" {
					group = "g_" + watermill.NewShortUUID()
					if bc.shared {
						group = "shared"
					}
				}
				sub, err := b.NewSubscriber(group)
				if err != nil {
					t.Fatal(err)
				}
				return used.publisher(b.Publisher), used.subscriber(sub, group)
			}
			tests.TestPubSub(t, features,
				func(t *testing.T) (message.Publisher, message.Subscriber) { return constructor(t, "") },
				constructor)
		})
	}
}

// Close must close every channel Subscribe handed out before it returns (Watermill's Subscriber
// contract): a router or a test that drains the channel after Close must never block. Repeated,
// because a library that closes its channel after signalling done loses the race only sometimes.
func TestBackends_CloseClosesEveryChannelBeforeReturning(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.scheme, func(t *testing.T) {
			t.Parallel()
			url := bc.url(t)
			b := openBackend(t, url, bc.opts)
			topic := "close_" + bc.scheme + "_" + watermill.NewShortUUID()
			dropWhenDone(t, bc.scheme, url, []string{topic}, []string{"g_close"})
			for i := range 30 {
				sub, err := b.NewSubscriber("g_close")
				if err != nil {
					t.Fatal(err)
				}
				msgs, err := sub.Subscribe(context.Background(), topic)
				if err != nil {
					t.Fatal(err)
				}
				if err := sub.Close(); err != nil {
					t.Fatal(err)
				}
				select {
				case _, open := <-msgs:
					if open {
						t.Fatalf("round %d: a message arrived on an empty topic after Close", i)
					}
				default:
					t.Fatalf("round %d: Close returned with the subscription's channel still open", i)
				}
			}
		})
	}
}
