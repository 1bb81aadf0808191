package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

type shipment struct {
	ID string `json:"id"`
}

// consumer runs a Watermill router reading group's queue of topic through the recommended stack,
// writing one row per shipment into the schema's effects table.
type consumer struct {
	handled atomic.Int32
}

func effectsTable(t testing.TB, pg *testenv.PG) {
	pg.Exec(t, `CREATE TABLE IF NOT EXISTS {{schema}}.effects (consumer text NOT NULL, message_id text NOT NULL, note text)`)
}

// startConsumer subscribes before returning, so that what is published next reaches it.
func startConsumer(t testing.TB, s *pgxstore.Store, amqpURL, topic, group string,
	hook func(msg *message.Message, s shipment) error, tune func(*middleware.StackConfig)) *consumer {
	t.Helper()
	c := &consumer{}
	cfg := middleware.StackConfig{
		Store: s, Consumer: group, MaxDeliveries: 3, MaxRetries: -1,
	}
	if tune != nil {
		tune(&cfg)
	}
	stack, err := middleware.Stack(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: amqpURL, Consumer: group})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	effectsIdent := `"` + s.Info().Schema + `".effects`
	handler := router.AddConsumerHandler(group, topic, sub, func(msg *message.Message) error {
		return handlers.JSON(func(ctx context.Context, tx pgx.Tx, s shipment) error {
			c.handled.Add(1)
			if hook != nil {
				if err := hook(msg, s); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+effectsIdent+` (consumer, message_id, note) VALUES ($1, $2, $3)`, group, msg.UUID, s.ID)
			return err
		})(msg)
	})
	handler.AddMiddleware(stack...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
		_ = sub.Close()
	})
	select {
	case <-router.Running():
	case <-time.After(20 * time.Second):
		t.Fatal("consumer did not start")
	}
	return c
}

func publishShipments(t testing.TB, url, topic string, ids ...string) []*message.Message {
	t.Helper()
	pub := amqpPublisher(t, url)
	var msgs []*message.Message
	for _, id := range ids {
		payload := []byte(fmt.Sprintf(`{"id":%q}`, id))
		if id == "not json" {
			payload = []byte("not json")
		}
		msg := pipeline.NewEvent("ShipmentRequested", id, payload)
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, msg)
	}
	return msgs
}

func goods(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("good-%03d", i)
	}
	return out
}

func waitEffects(t testing.TB, pg *testenv.PG, group string, n int) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d effects for %s", n, group), func() bool {
		return pg.Int(t, `SELECT count(DISTINCT message_id) FROM {{schema}}.effects WHERE consumer = $1`, group) >= n
	})
	if dup := pg.Int(t, `SELECT count(*) - count(DISTINCT message_id) FROM {{schema}}.effects WHERE consumer = $1`, group); dup != 0 {
		t.Fatalf("%d effects applied twice", dup)
	}
}

// Failure matrix, "poison message": through RabbitMQ, the payload `not json` is dead-lettered on
// its first delivery and a transiently failing message after exactly MaxDeliveries = 3; the 100
// good messages behind each are all processed.
func TestConsumer_PoisonThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"not json", "always failing"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			effectsTable(t, pg)
			url := testenv.AMQPURL(t)
			topic := testenv.UniqueName(t, "shipments")
			testenv.DeclareQueue(t, url, topic, "shipping")
			msgs := publishShipments(t, url, topic, append([]string{kind}, goods(100)...)...)
			poison := msgs[0]
			var poisonDeliveries atomic.Int32
			startConsumer(t, pg.Store, url, topic, "shipping", func(msg *message.Message, s shipment) error {
				if s.ID == "always failing" {
					poisonDeliveries.Add(1)
					return errors.New("payment provider timeout")
				}
				return nil
			}, nil)
			waitEffects(t, pg, "shipping", 100)
			testenv.Eventually(t, 30*time.Second, "the poison to be dead-lettered", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE message_id = $1`, poison.UUID) == 1
			})
			want := 1
			if kind == "always failing" {
				want = 3
				if n := poisonDeliveries.Load(); n != 3 {
					t.Fatalf("the failing message ran %d times, want 3 (one per delivery, no retries)", n)
				}
			}
			if n := pg.Int(t, `SELECT deliveries FROM {{schema}}.dead_letters WHERE message_id = $1`, poison.UUID); n != want {
				t.Fatalf("dead-lettered after %d deliveries, want %d", n, want)
			}
		})
	}
}

// On RabbitMQ a handler error nacks with requeue: the redelivered message takes the same path and
// its delivery is counted.
func TestConsumer_RedeliveryIsCounted(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	effectsTable(t, pg)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "shipments")
	testenv.DeclareQueue(t, url, topic, "shipping")
	msg := publishShipments(t, url, topic, "flaky")[0]
	var seen []int
	var calls atomic.Int32
	startConsumer(t, pg.Store, url, topic, "shipping", func(m *message.Message, s shipment) error {
		seen = append(seen, middleware.Deliveries(m.Context()))
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}, nil)
	waitEffects(t, pg, "shipping", 1)
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
		t.Fatalf("the handler saw delivery counts %v, want [1 2]: the broker's redelivery must be counted", seen)
	}
	if n := pg.Int(t, `SELECT deliveries FROM {{schema}}.inbox_deliveries WHERE message_id = $1`, msg.UUID); n != 2 {
		t.Fatalf("inbox_deliveries = %d, want 2", n)
	}
}

// Failure matrix, "poison message that kills the process": the consumer process exits inside the
// handler; the test restarts it. The message is dead-lettered once it has been delivered more than
// MaxDeliveries = 3 times and crashed the process once more on its attempt alone in it, and the
// consumer then drains the rest.
func TestConsumer_MessageThatKillsTheProcess(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	effectsTable(t, pg)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "shipments")
	testenv.DeclareQueue(t, url, topic, "crashy")
	msgs := publishShipments(t, url, topic, append([]string{"crash"}, goods(20)...)...)

	crashes := 0
	for run := 1; ; run++ {
		if run > 10 {
			t.Fatalf("still crashing after %d runs", run-1)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashyConsumer$", "-test.v")
		cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_CONSUMER="+strings.Join([]string{pg.URL, string(pg.Schema), url, topic, "20"}, "|"))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 7 {
			crashes++
			continue
		}
		if err != nil {
			t.Fatalf("consumer run %d failed: %v\n%s", run, err, out)
		}
		break
	}
	if crashes != 4 {
		t.Fatalf("the consumer crashed %d times, want MaxDeliveries = 3, and once alone, before the dead-letter", crashes)
	}
	var reason string
	if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(
		`SELECT reason FROM {{schema}}.dead_letters WHERE message_id = $1`), msgs[0].UUID).Scan(&reason); err != nil {
		t.Fatalf("the crashing message was not dead-lettered: %v", err)
	}
	if !strings.Contains(reason, "delivered 5 times without finishing") || !strings.Contains(reason, "alone in the process") {
		t.Fatalf("reason %q", reason)
	}
	waitEffects(t, pg, "crashy", 20)
}

// TestHelperCrashyConsumer is the consumer process of TestConsumer_MessageThatKillsTheProcess. It
// exits with status 7 inside the handler for the message "crash", and with 0 once it has processed
// the expected number of other messages.
func TestHelperCrashyConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_CONSUMER")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	parts := strings.Split(spec, "|")
	pgURL, schemaName, amqpURL, topic := parts[0], parts[1], parts[2], parts[3]
	var want int
	if _, err := fmt.Sscan(parts[4], &want); err != nil {
		t.Fatalf("OUTBOXKIT_HELPER_CONSUMER: the message count %q: %v", parts[4], err)
	}
	pool, err := pgxpool.New(context.Background(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	startConsumer(t, pgStore(t, pool, schemaName), amqpURL, topic, "crashy", func(msg *message.Message, s shipment) error {
		if s.ID == "crash" {
			os.Exit(7) // the process dies mid-handler, its transaction open
		}
		return nil
	}, nil)
	effects := `"` + schemaName + `".effects`
	testenv.Eventually(t, 60*time.Second, "the good messages", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(DISTINCT message_id) FROM `+effects+` WHERE consumer = 'crashy'`).Scan(&n)
		return n >= want
	})
}
