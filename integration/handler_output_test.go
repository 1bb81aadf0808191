package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// A handler returns a follow-up event (Watermill's AddHandler: the router publishes what the
// handler returns). The consumer process dies right after the inbox committed the effect, before
// the router could publish. The event must still arrive, exactly once: the inbox writes it into the
// outbox in the effect's transaction, and the forwarder relays it.
func TestConsumer_HandlerOutputSurvivesACrashAfterCommit(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	url := testenv.AMQPURL(t)
	orders := testenv.UniqueName(t, "orders")
	invoices := testenv.UniqueName(t, "invoices")
	testenv.DeclareQueue(t, url, orders, "billing")
	downstream := testenv.BindQueue(t, url, invoices)
	order := publishShipments(t, url, orders, "order-1")[0]

	runHelper := func(crash bool) error {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperEmittingConsumer$", "-test.v")
		spec := []string{pg.URL, string(pg.Schema), url, orders, invoices, order.UUID, "no-crash"}
		if crash {
			spec[6] = "crash"
		}
		cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_EMITTER="+strings.Join(spec, "|"))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if crash && errors.As(err, &exit) && exit.ExitCode() == 9 {
			return nil
		}
		if err != nil {
			return errors.New(err.Error() + "\n" + string(out))
		}
		return nil
	}
	if err := runHelper(true); err != nil {
		t.Fatalf("first consumer run should have died after its commit: %v", err)
	}
	if err := runHelper(false); err != nil {
		t.Fatalf("restarted consumer: %v", err)
	}

	// The consumer's own service relays its outbox, as the writer's does.
	relay := newRelay(t, pgDB(pg), amqpPublisher(t, url))
	storetest.RunForwarder(t, relay)
	downstream.WaitFor(t, 1, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "the consumer's outbox to drain", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE topic = $1`, invoices); n != 1 {
		t.Fatalf("%d outbox rows for the follow-up event, want exactly 1", n)
	}
	got := downstream.Received()
	if len(got) != 1 {
		t.Fatalf("the follow-up event arrived %d times, want exactly once", len(got))
	}
	if got[0].Headers["caused_by"] != order.UUID {
		t.Fatalf("arrived %+v, want the event the handler returned for %s", got[0].Headers, order.UUID)
	}
}

// TestHelperEmittingConsumer is the consumer process of TestConsumer_HandlerOutputSurvivesACrashAfterCommit.
// Its handler returns one InvoiceIssued event per order. With "crash" it exits with status 9 right
// after the inbox committed, before the router publishes anything; otherwise it runs until the
// broker's redelivery of the order has been absorbed by the inbox.
func TestHelperEmittingConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_EMITTER")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	pgURL, schemaName, amqpURL, orders, invoices, orderID, mode := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	stack, err := middleware.Stack(middleware.StackConfig{Store: pgStore(t, pool, schemaName), Consumer: "billing", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: amqpURL, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: amqpURL})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	h := router.AddHandler("billing", orders, sub, invoices, pub, func(msg *message.Message) ([]*message.Message, error) {
		invoice := pipeline.NewEvent("InvoiceIssued", "invoice-for-"+msg.UUID, []byte(`{}`))
		invoice.Metadata.Set("caused_by", msg.UUID)
		return []*message.Message{invoice}, nil
	})
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err == nil && mode == "crash" {
				os.Exit(9) // the effect is committed; the router has published nothing yet
			}
			return out, err
		}
	})
	h.AddMiddleware(stack...)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- router.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	testenv.Eventually(t, 60*time.Second, "the redelivered order to be absorbed", func() bool {
		var dups int
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(duplicates), 0) FROM "`+schemaName+`".inbox WHERE message_id = $1`, orderID).Scan(&dups)
		return dups >= 1
	})
}
