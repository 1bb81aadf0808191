package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a migrated schema with an effects table and a metrics registry.
type env struct {
	pg  *testenv.PG
	reg *prometheus.Registry
	now func() time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{pg: testenv.NewPG(t), reg: prometheus.NewRegistry(), now: time.Now}
	e.pg.Exec(t, `CREATE TABLE {{schema}}.effects (consumer text NOT NULL, message_id text NOT NULL, note text)`)
	return e
}

// order is the event the test handlers consume.
type order struct {
	ID string `json:"id"`
}

// effect is a typed handler writing one effects row through the inbox transaction.
func effect(consumer string) message.NoPublishHandlerFunc {
	return handlers.JSON(func(ctx context.Context, tx pgx.Tx, o order) error {
		msg := ctx.Value(msgKey{}).(*message.Message)
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, message_id, note) VALUES ($1, $2, $3)`, consumer, msg.UUID, o.ID)
		return err
	})
}

type msgKey struct{}

// stack wraps h in the recommended stack for consumer, with fast retries.
func (e *env) stack(t *testing.T, consumer string, h message.NoPublishHandlerFunc, tune ...func(*middleware.StackConfig)) message.HandlerFunc {
	t.Helper()
	cfg := middleware.StackConfig{
		Pool: e.pg.Pool, Schema: string(e.pg.Schema), Consumer: consumer, Registerer: e.reg, Now: e.now,
		RetryBackoff: outboxkit.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Multiplier: 2},
	}
	for _, fn := range tune {
		fn(&cfg)
	}
	ms, err := middleware.Stack(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handler message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		// The effects table lives in the test's schema: point the transaction's search path at it.
		tx, ok := handlers.TxFrom(msg.Context())
		if ok {
			if _, err := tx.Exec(msg.Context(), "SET LOCAL search_path TO "+e.pg.Schema.Ident()); err != nil {
				return nil, err
			}
		}
		msg.SetContext(context.WithValue(msg.Context(), msgKey{}, msg))
		return nil, h(msg)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		handler = ms[i](handler)
	}
	return handler
}

// delivery is a fresh copy of msg, as a broker hands over each (re)delivery.
func delivery(msg *message.Message) *message.Message {
	c := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		c.Metadata.Set(k, v)
	}
	return c
}

func orderMsg(id string) *message.Message {
	return message.NewMessage(fmt.Sprintf("msg-%s-%d", id, time.Now().UnixNano()), []byte(fmt.Sprintf(`{"id":%q}`, id)))
}

func (e *env) count(t *testing.T, table, consumer, uuid string) int {
	t.Helper()
	return e.pg.Int(t, `SELECT count(*) FROM {{schema}}.`+table+` WHERE consumer = $1 AND message_id = $2`, consumer, uuid)
}

// outcome reads outboxkit_consumer_messages_total for consumer and outcome.
func (e *env) outcome(t *testing.T, consumer, outcome string) int {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "outboxkit_consumer_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == consumer && labels["outcome"] == outcome {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}

var errTransient = errors.New("downstream service unavailable")

// fastPaths runs a dedup test with the inbox's fast-path read on and off: the read must only be
// an optimisation.
var fastPaths = []struct {
	name    string
	disable bool
}{{"fast path on", false}, {"fast path off", true}}

func withPool(pool *pgxpool.Pool) func(*middleware.StackConfig) {
	return func(c *middleware.StackConfig) { c.Pool = pool }
}
