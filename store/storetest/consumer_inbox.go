package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store"
)

// fastPaths runs a dedup test with the inbox's fast-path read on and off: the read must only be
// an optimisation.
var fastPaths = []struct {
	name    string
	disable bool
}{{"fast path on", false}, {"fast path off", true}}

// The effect's second write fails once: after the failure there is no effect and no inbox row; the
// retry succeeds; in the end there is exactly one of each.
func inboxFailedEffect[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumerEnv(t, h)
			msg := orderMsg("o-1")
			var attempts atomic.Int32
			var afterFailure [2]int
			hf := handlers.JSON(func(ctx context.Context, tx TTx, o order) error {
				n := attempts.Add(1)
				if n == 2 { // look from outside the transaction at what the failed attempt left
					afterFailure[0] = e.count(t, "effects", "shipping", msg.UUID)
					afterFailure[1] = e.count(t, "inbox", "shipping", msg.UUID)
				}
				if err := e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.effects (consumer, message_id, note) VALUES ('shipping', ?, ?)`, msg.UUID, o.ID); err != nil {
					return err
				}
				if n == 1 {
					return e.ExecTx(ctx, tx, `INSERT INTO {{schema}}.no_such_table (x) VALUES (1)`) // the effect's second write fails
				}
				return nil
			})
			stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable })
			if _, err := stack(delivery(msg)); err != nil {
				t.Fatalf("delivery failed: %v (the in-process retry should have succeeded)", err)
			}
			if attempts.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2 (one failure, one retry)", attempts.Load())
			}
			if afterFailure != [2]int{0, 0} {
				t.Fatalf("after the failed attempt: %d effects and %d inbox rows, want none", afterFailure[0], afterFailure[1])
			}
			if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
				t.Fatalf("in the end: %d effects and %d inbox rows, want one of each", got[0], got[1])
			}
		})
	}
}

// One message delivered 50 times at once — redeliveries, serialized by the message lock, and
// first deliveries the broker vouches for, which take no lock and meet on the inbox row: one
// effect, one inbox row, 49 duplicates.
//
// The first delivery holds its transaction until every delivery has begun. It holds a session per
// delivery, so the cases run one after the other and take no more sessions than the database can
// spare beside other tests (at least 20).
func inboxFiftyConcurrent[TTx any](t *testing.T, h Harness[TTx]) {
	n := h.sessions(t, 50)
	if n < 20 {
		t.Fatalf("only %d sessions to spare; the test needs 20", n)
	}
	for _, path := range []string{"redeliveries (locked)", "vouched first deliveries (no lock)"} {
		for _, fp := range fastPaths {
			t.Run(path+", "+fp.name, func(t *testing.T) {
				e := newConsumerEnv(t, h)
				msg := orderMsg("o-1")
				var runs, entered atomic.Int32
				hf := func(m *message.Message) error {
					if runs.Add(1) == 1 && !waitFor(20*time.Second, func() bool { return entered.Load() == int32(n) }) {
						return errors.New("the other deliveries never began")
					}
					return e.effect("shipping")(m)
				}
				stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable; c.MaxRetries = -1 })
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						d := delivery(msg)
						if path != "redeliveries (locked)" {
							d = brokerDelivery(msg, false)
						}
						entered.Add(1)
						if _, err := stack(d); err != nil {
							errs <- err
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("a delivery failed: %v", err)
				}
				if runs.Load() != 1 {
					t.Fatalf("handler ran %d times, want once", runs.Load())
				}
				if got := [2]int{e.count(t, "effects", "shipping", msg.UUID), e.count(t, "inbox", "shipping", msg.UUID)}; got != [2]int{1, 1} {
					t.Fatalf("%d effects and %d inbox rows, want one of each", got[0], got[1])
				}
				if d := e.outcome(t, "shipping", "duplicate"); d != n-1 {
					t.Fatalf("%d duplicates counted, want %d", d, n-1)
				}
			})
		}
	}
}

// Two consumers of the same message each process it once, each with its own inbox row.
func inboxTwoConsumers[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	for _, fp := range fastPaths {
		t.Run(fp.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumerEnv(t, h)
			msg := orderMsg("o-1")
			tune := func(c *middleware.StackConfig) { c.DisableFastPath = fp.disable }
			shipping := e.stack(t, "shipping", e.effect("shipping"), tune)
			billing := e.stack(t, "billing", e.effect("billing"), tune)
			for i := 0; i < 3; i++ { // each consumer gets the message three times
				for _, s := range []message.HandlerFunc{shipping, billing} {
					if _, err := s(delivery(msg)); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, c := range []string{"shipping", "billing"} {
				if got := [2]int{e.count(t, "effects", c, msg.UUID), e.count(t, "inbox", c, msg.UUID)}; got != [2]int{1, 1} {
					t.Fatalf("%s: %d effects and %d inbox rows, want one of each", c, got[0], got[1])
				}
				if d := e.outcome(t, c, "duplicate"); d != 2 {
					t.Fatalf("%s: %d duplicates, want 2", c, d)
				}
			}
		})
	}
}

// A message written longer ago than the inbox retention, with no inbox row, may be a redelivery
// whose row was pruned: it is dead-lettered, not processed as new.
func inboxOlderThanRetention[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	msg := orderMsg("o-1")
	msg.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-8*24*time.Hour).Format(time.RFC3339Nano))
	stack := e.stack(t, "shipping", e.effect("shipping"))
	if _, err := stack(delivery(msg)); err != nil {
		t.Fatalf("dead-letter should acknowledge: %v", err)
	}
	if e.count(t, "effects", "shipping", msg.UUID) != 0 || e.count(t, "inbox", "shipping", msg.UUID) != 0 {
		t.Fatal("an old message without an inbox row was processed as new")
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{All: true})
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "possible duplicate") {
		t.Fatalf("dead letters = %+v; want one possible duplicate", letters)
	}
	fresh := orderMsg("o-2")
	fresh.Metadata.Set(outboxkit.MetadataCreatedAt, time.Now().Add(-time.Hour).Format(time.RFC3339Nano))
	if _, err := stack(delivery(fresh)); err != nil || e.count(t, "effects", "shipping", fresh.UUID) != 1 {
		t.Fatalf("a message within the retention was not processed: %v", err)
	}
}

// What a handler returns goes into the outbox, in the inbox's transaction, to the handler's
// publish topic; the router itself publishes nothing. A handler that fails after returning
// messages leaves no outbox row; outside a router that knows a publish topic, returned messages
// are refused with what to do.
func inboxHandlerOutput[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer bus.Close()
	direct, err := bus.Subscribe(context.Background(), "invoices")
	if err != nil {
		t.Fatal(err)
	}
	stack, err := middleware.Stack(middleware.StackConfig{Store: e.Store, Consumer: "billing", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Each delivery's outcome, once the whole stack has returned (the inbox committed or rolled back).
	type outcome struct {
		uuid string
		err  error
	}
	outcomes := make(chan outcome, 10)
	hr := router.AddHandler("billing", "orders", bus, "invoices", bus, func(msg *message.Message) ([]*message.Message, error) {
		invoice := pipeline.NewEvent("InvoiceIssued", "inv-"+msg.UUID, []byte(`{}`))
		if string(msg.Payload) == `"fail after emitting"` {
			return []*message.Message{invoice}, handlers.Permanent(errors.New("the effect failed"))
		}
		return []*message.Message{invoice}, nil
	})
	hr.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			outcomes <- outcome{msg.UUID, err}
			return out, err
		}
	})
	hr.AddMiddleware(stack...)
	defer runRouter(t, router)()
	ok, bad := message.NewMessage("m-ok", []byte(`{}`)), message.NewMessage("m-bad", []byte(`"fail after emitting"`))
	for _, m := range []*message.Message{ok, bad} {
		if err := bus.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		for settled := false; !settled; { // acknowledged: processed, or dead-lettered (DeadLetter acks)
			select {
			case o := <-outcomes:
				if o.err != nil {
					t.Logf("delivery of %s failed (%v); the broker delivers it again", o.uuid, o.err)
				}
				settled = o.uuid == m.UUID && o.err == nil
			case <-time.After(10 * time.Second):
				t.Fatalf("message %s was not handled", m.UUID)
			}
		}
	}
	if !waitFor(10*time.Second, func() bool { return e.count(t, "dead_letters", "billing", "m-bad") == 1 }) {
		t.Fatal("the failing message was not dead-lettered")
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox WHERE topic = 'invoices' AND partition_key = 'inv-m-ok'`); n != 1 {
		t.Fatalf("%d outbox rows for the returned message, want 1", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`); n != 1 {
		t.Fatalf("%d outbox rows in all, want 1: a failed handler's output must roll back with its effect", n)
	}
	select {
	case m := <-direct:
		t.Fatalf("the router published %s itself; it must go through the outbox only", m.UUID)
	default:
	}

	// Without a router's publish topic.
	var plain message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{pipeline.NewEvent("X", "k", nil)}, nil
	}
	for i := len(stack) - 1; i >= 0; i-- {
		plain = stack[i](plain)
	}
	msg := orderMsg("o-1")
	if _, err := plain(delivery(msg)); err == nil || !strings.Contains(err.Error(), "publish topic") {
		t.Fatalf("err = %v, want one naming the missing publish topic", err)
	}
	if e.count(t, "inbox", "billing", msg.UUID) != 0 {
		t.Fatal("the refused delivery was committed")
	}
}

func inboxHandlerOutputWithoutTopic[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	ms, err := middleware.Stack(middleware.StackConfig{Store: e.Store, Consumer: "billing", MaxRetries: -1, Metrics: prom.NewConsumerMetrics(e.reg)})
	if err != nil {
		t.Fatal(err)
	}
	var handler message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{pipeline.NewEvent("X", "k", nil)}, nil
	}
	for i := len(ms) - 1; i >= 0; i-- {
		handler = ms[i](handler)
	}
	msg := orderMsg("o-1")
	_, err = handler(delivery(msg))
	if err == nil || !strings.Contains(err.Error(), "publish topic") {
		t.Fatalf("err = %v, want one naming the missing publish topic", err)
	}
	if e.count(t, "inbox", "billing", msg.UUID) != 0 || e.MustInt(t, `SELECT count(*) FROM {{schema}}.outbox`) != 0 {
		t.Fatal("something was committed")
	}
}

func pruneInbox[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := newConsumerEnv(t, h)
	var mu sync.Mutex
	now := time.Now()
	e.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	stack := e.stack(t, "shipping", e.effect("shipping"))
	var old, recent []string
	for i := 0; i < 25; i++ {
		m := orderMsg("old")
		old = append(old, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(48 * time.Hour)
	for i := 0; i < 5; i++ {
		m := orderMsg("recent")
		recent = append(recent, m.UUID)
		if _, err := stack(delivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	advance(time.Hour)
	n, err := middleware.PruneInbox(context.Background(), middleware.PruneConfig{Store: e.Store, BatchSize: 7, Now: e.now}, 24*time.Hour)
	if err != nil || n != 25 {
		t.Fatalf("pruned %d rows (%v), want the 25 older than a day", n, err)
	}
	for _, id := range recent {
		if e.count(t, "inbox", "shipping", id) != 1 {
			t.Fatalf("recent inbox row %s was pruned", id)
		}
	}
	for _, id := range old {
		if e.count(t, "inbox", "shipping", id) != 0 {
			t.Fatalf("old inbox row %s survived", id)
		}
	}
}
