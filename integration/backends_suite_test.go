package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
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

// rawWriters write a message straight to a broker, in no format outboxkit's publisher writes:
// garbage, as another producer might. Each returns what the dead letter's reason must name (the
// decode error and where the message stood). Postgres topics and the in-memory bus have no other
// producer.
var rawWriters = map[string]func(t *testing.T, url, topic string) []malformed{
	// A fields map whose metadata is not msgpack, and one with no id of any kind.
	"redis": func(t *testing.T, url, topic string) []malformed {
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(opts)
		defer client.Close()
		add := func(values map[string]any) string {
			id, err := client.XAdd(context.Background(), &redis.XAddArgs{Stream: topic, Values: values}).Result()
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		badMetadata := add(map[string]any{"_watermill_message_uuid": watermill.NewUUID(), "metadata": "\xc1 not msgpack", "payload": `{"bad":"metadata"}`})
		noID := add(map[string]any{"payload": `{"no":"id"}`})
		return []malformed{
			{payload: `{"bad":"metadata"}`, reason: []string{"stream entry " + badMetadata, "unmarshal metadata"}},
			{payload: `{"no":"id"}`, reason: []string{"stream entry " + noID, "nor ce_id"}},
		}
	},
	// A header with two values, which Watermill's format cannot put in metadata.
	"nats": func(t *testing.T, url, topic string) []malformed {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		h := nats.Header{"X-Twice": {"a", "b"}}
		ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: topic, Header: h, Data: []byte(`{"two":"values"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return []malformed{{payload: `{"two":"values"}`, reason: []string{fmt.Sprintf("sequence %d", ack.Sequence), "multiple values"}}}
	},
	// Watermill's UUID header holding a number.
	"amqp": func(t *testing.T, url, topic string) []malformed {
		err := amqpChannel(t, url).PublishWithContext(context.Background(), topic, "", false, false, amqp.Publishing{
			Headers: amqp.Table{"_watermill_message_uuid": int32(7)}, MessageId: "m-7", Body: []byte(`{"uuid":"a number"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return []malformed{{payload: `{"uuid":"a number"}`, reason: []string{"m-7", "not a string"}}}
	},
	// Kafka's format reads any record; a record without an id is what another producer may write.
	"kafka": func(t *testing.T, url, topic string) []malformed {
		cfg := sarama.NewConfig()
		cfg.Producer.Return.Successes = true
		p, err := sarama.NewSyncProducer([]string{strings.TrimPrefix(url, "kafka://")}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(`{"no":"id"}`)}); err != nil {
			t.Fatal(err)
		}
		return []malformed{{payload: `{"no":"id"}`, reason: []string{"has no UUID"}}}
	},
}

// malformed is a message a raw writer wrote: its payload, and what its dead letter's reason says.
type malformed struct {
	payload string
	reason  []string
}

// A message that cannot be read is dead-lettered by the consumer, with why and where it stood in
// the broker, and acknowledged: never dropped, never blocking what comes after it — through the
// per-message stack and through the batch consumer. A replay then gets it handled.
func TestBackends_MalformedMessageIsDeadLettered(t *testing.T) {
	for _, bc := range backendCases {
		write := rawWriters[bc.scheme]
		if write == nil {
			continue
		}
		for _, batch := range []int{0, 10} {
			t.Run(fmt.Sprintf("%s/batch=%d", bc.scheme, batch), func(t *testing.T) {
				t.Parallel()
				url := bc.url(t)
				db := pgDB(testenv.NewPG(t))
				createEffects(t, db)
				opts := bc.opts
				var consumerOpts []effectConsumerOpt
				if batch > 0 {
					opts.Unacked = batch
					consumerOpts = append(consumerOpts, withBatch(batch))
				}
				b := openBackend(t, url, opts)
				topic := testenv.UniqueName(t, "malformed")
				group := "billing"
				dropWhenDone(t, bc.scheme, url, []string{topic}, []string{group})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				startEffectConsumer(t, ctx, db, b, topic, group, consumerOpts...)

				before, after := message.NewMessage(watermill.NewUUID(), []byte(`{}`)), message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				if err := b.Publisher.Publish(topic, before); err != nil {
					t.Fatal(err)
				}
				bad := write(t, url, topic)
				if err := b.Publisher.Publish(topic, after); err != nil {
					t.Fatal(err)
				}

				var letters []store.DeadLetter
				testenv.Eventually(t, 60*time.Second, "the 2 good messages applied and the malformed ones dead-lettered", func() bool {
					var err error
					letters, err = db.Store().InboxDeadLetters(ctx, store.DeadLetterFilter{Consumer: group, Topic: topic})
					if err != nil {
						t.Fatal(err)
					}
					return countEffects(t, db, group) == 2 && len(letters) >= len(bad)
				})
				if len(letters) != len(bad) {
					t.Fatalf("%d dead letters, want %d: %+v", len(letters), len(bad), letters)
				}
				for _, m := range bad {
					found := false
					for _, l := range letters {
						if string(l.Payload) != m.payload {
							continue
						}
						found = true
						if !strings.HasPrefix(l.MessageID, "no-id:") || l.Attempts != 1 {
							t.Errorf("dead letter %s after %d deliveries; want a no-id: id on the first", l.MessageID, l.Attempts)
						}
						for _, want := range m.reason {
							if !strings.Contains(l.Reason, want) {
								t.Errorf("dead letter's reason %q does not say %q", l.Reason, want)
							}
						}
					}
					if !found {
						t.Errorf("no dead letter holds the payload %s as it came; dead letters: %+v", m.payload, letters)
					}
				}
				// Dead-lettered, then acknowledged: nothing stays with the group to be delivered again.
				testenv.Eventually(t, 30*time.Second, "the group to have nothing left", func() bool {
					lag, err := b.Lag(ctx, topic, group)
					return err == nil && lag.Waiting == 0 && (!lag.HasUnacked || lag.Unacked == 0)
				})
				// An operator's replay sends each back with an id of its own, and it is handled.
				replayed, err := middleware.ReplayInboxDeadLetters(ctx, middleware.ReplayConfig{Store: db.Store(), Publisher: b.Publisher},
					store.DeadLetterFilter{Consumer: group, Topic: topic})
				if err != nil || len(replayed) != len(bad) {
					t.Fatalf("replay = %d letters, %v", len(replayed), err)
				}
				testenv.Eventually(t, 60*time.Second, "the replayed messages to be handled", func() bool {
					return countEffects(t, db, group) == 2+len(bad)
				})
			})
		}
	}
}

// No goroutine of a subscriber, or of the backend, outlives their Close: a subscription that
// handed out a message and one that was still subscribing in the background end with them. Not
// parallel, so that no other test's goroutines are counted.
func TestBackends_NoGoroutineOutlivesClose(t *testing.T) {
	for _, bc := range backendCases {
		if rawWriters[bc.scheme] == nil {
			continue // the brokers with subscribers of outboxkit's own
		}
		t.Run(bc.scheme, func(t *testing.T) {
			url := bc.url(t)
			topic := testenv.UniqueName(t, "leak")
			group := "billing"
			dropWhenDone(t, bc.scheme, url, []string{topic}, []string{group})
			before := goleak.IgnoreCurrent()
			b, err := backends.Open(context.Background(), url, bc.opts)
			if err != nil {
				t.Fatal(err)
			}
			sub, err := b.NewSubscriber(group)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sub.Subscribe(ctx, topic+"_other"); err != nil { // a second subscription, left running
				t.Fatal(err)
			}
			dropWhenDone(t, bc.scheme, url, []string{topic + "_other"}, []string{group})
			if err := b.Publisher.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-msgs:
				m.Ack()
			case <-time.After(60 * time.Second):
				t.Fatal("no message within 60s")
			}
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			// Sarama starts go-metrics' meter ticker once per process, for good.
			if err := goleak.Find(before, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")); err != nil {
				t.Fatal(err)
			}
		})
	}
}
