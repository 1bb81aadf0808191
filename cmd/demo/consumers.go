package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/prom"
)

type consumerSpec struct {
	name, table, effect string
}

var consumerNames = []consumerSpec{
	{"shipping", "shipments", "shipment created"},
	{"billing", "invoices", "invoice issued"},
	{"search", "search_entries", "indexed"},
}

// errSimulatedCrash is what --consumer-crash-every makes the billing handler return after writing
// its invoice: the transaction rolls back as if the process had died before committing.
var errSimulatedCrash = errors.New("simulated crash before commit (--consumer-crash-every)")

// addConsumers subscribes Shipping, Billing and Search to topic, each behind its own inbox.
func addConsumers(router *message.Router, b *business, broker *backends.Backend, topic string,
	reg prometheus.Registerer, gateway *gatewayClient, o options, logger watermill.LoggerAdapter) error {
	crashEvery, crashAfterChargeEvery, reject := o.consumerCrash, o.crashAfterCharge, o.rejectCustomer
	var billed, charged atomic.Int64
	exec := func(ctx context.Context, tx *sql.Tx, query string, args ...any) error {
		_, err := tx.ExecContext(ctx, b.q(query), args...)
		return err
	}
	effects := map[string]handlers.Func[*sql.Tx, OrderPlaced]{
		"shipping": func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
			if cancelled(ctx) {
				return exec(ctx, tx, `UPDATE {{t}}.shipments SET cancelled_at = ? WHERE order_id = ?`, b.now(), o.OrderID)
			}
			return exec(ctx, tx, `INSERT INTO {{t}}.shipments (order_id, created_at) VALUES (?, ?)`, o.OrderID, b.now())
		},
		"billing": func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
			if cancelled(ctx) {
				return exec(ctx, tx, `UPDATE {{t}}.invoices SET refunded_at = ? WHERE order_id = ?`, b.now(), o.OrderID)
			}
			if reject != "" && o.Customer == reject {
				return handlers.Permanent(fmt.Errorf("customer %q has no billing account (--reject-customer)", o.Customer))
			}
			// The charge is outside this transaction: the gateway deduplicates it on the key, which
			// is the same on every delivery of this order's event to Billing.
			key, ok := outboundKey(ctx)
			if !ok {
				return errors.New("billing runs outside its inbox: no idempotency key for the payment gateway")
			}
			if err := gateway.charge(ctx, key, chargeRequest{OrderID: o.OrderID, AmountCents: o.TotalCents}); err != nil {
				return err
			}
			if crashAfterChargeEvery > 0 && charged.Add(1)%crashAfterChargeEvery == 0 {
				crashAfterCharge(o.OrderID, crashAfterChargeEvery)
			}
			if err := exec(ctx, tx, `INSERT INTO {{t}}.invoices (order_id, amount_cents, created_at) VALUES (?, ?, ?)`,
				o.OrderID, o.TotalCents, b.now()); err != nil {
				return err
			}
			if crashEvery > 0 && billed.Add(1)%crashEvery == 0 {
				return errSimulatedCrash
			}
			return nil
		},
		"search": func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
			status := "placed"
			if cancelled(ctx) {
				status = "cancelled"
			}
			_, err := tx.ExecContext(ctx, b.upsertSearch(),
				o.OrderID, fmt.Sprintf("%s %s %d %s", o.OrderID, o.Customer, o.TotalCents, status), b.now())
			return err
		},
	}
	for _, c := range consumerNames {
		if !o.runsConsumer(c.name) {
			continue
		}
		sub, err := broker.NewSubscriber(c.name)
		if err != nil {
			return fmt.Errorf("consumer %s: cannot subscribe: %w", c.name, err)
		}
		h := handlers.JSON(logged(b, c.name, effects[c.name]))
		if o.noInbox {
			stack, err := stackWithoutInbox(b, c.name, logger)
			if err != nil {
				return err
			}
			router.AddConsumerHandler(c.name, topic, sub, h).AddMiddleware(stack...)
			continue
		}
		// The order guard applies an order's events in version order (OrderCancelled after
		// OrderPlaced) whatever the broker does with a redelivery.
		if _, err := middleware.AddConsumerHandler(router, c.name, topic, sub, middleware.StackConfig{
			Store: b.db, Consumer: c.name, Metrics: prom.NewConsumerMetrics(reg), Logger: logger,
			RetryBackoff: middleware.DefaultRetryBackoff, MaxRetries: 1,
			OrderGuard: &middleware.OrderGuardConfig{},
		}, h); err != nil {
			return err
		}
	}
	return nil
}

// logged records each effect fn commits in the effects table, in fn's transaction: one row per
// handler run that committed, so that an event handled twice shows as two rows.
func logged(b *business, consumer string, fn handlers.Func[*sql.Tx, OrderPlaced]) handlers.Func[*sql.Tx, OrderPlaced] {
	insert := b.q(`INSERT INTO {{t}}.effects (consumer, order_id, event, message_id, applied_at) VALUES (?, ?, ?, ?, ?)`)
	return func(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
		if err := fn(ctx, tx, o); err != nil {
			return err
		}
		event, id := "OrderPlaced", ""
		if msg, ok := handlers.MessageFrom(ctx); ok {
			event, id = outboxkit.EventType(msg), msg.UUID
		}
		_, err := tx.ExecContext(ctx, insert, consumer, o.OrderID, event, id, b.now())
		return err
	}
}

// stackWithoutInbox is --no-inbox: the consumer stack with its inbox (and so its order guard)
// taken out, each message handled in a plain transaction of its own. Redeliveries are applied again: the
// effects table shows them. It exists to show what the inbox prevents; never run a consumer so.
func stackWithoutInbox(b *business, consumer string, logger watermill.LoggerAdapter) ([]message.HandlerMiddleware, error) {
	unreachable := middleware.IsUnreachableIn(b.db)
	circuit, err1 := middleware.NewCircuit(middleware.CircuitConfig{Consumer: consumer, IsUnreachable: unreachable, Logger: logger})
	count, err2 := middleware.NewDeliveryCount(middleware.DeliveryCountConfig{Store: b.db, Consumer: consumer, IsUnreachable: unreachable, Logger: logger})
	dead, err3 := middleware.NewDeadLetter(middleware.DeadLetterConfig{Store: b.db, Consumer: consumer, IsUnreachable: unreachable, Logger: logger})
	retry, err4 := middleware.NewRetry(middleware.RetryConfig{MaxRetries: 1, Backoff: middleware.DefaultRetryBackoff, IsUnreachable: unreachable, Logger: logger})
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	plainTx := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, err := b.db.SQL.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback() }()
			ctx = context.WithValue(outboxkit.WithTx(ctx, tx), noInboxKey{}, outboxkit.OutboundKey(consumer, msg.UUID))
			msg.SetContext(ctx)
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			return out, tx.Commit()
		}
	}
	// A counted delivery holds a connection and its plain transaction takes a second (the inbox
	// would reuse the first): two at a time per consumer keep a broker that hands out many at
	// once (memory://) from taking every connection of the pool and waiting for one more.
	inFlight := make(chan struct{}, 2)
	limit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			inFlight <- struct{}{}
			defer func() { <-inFlight }()
			return h(msg)
		}
	}
	return []message.HandlerMiddleware{limit, circuit, count, dead, retry, plainTx}, nil
}

// noInboxKey carries the outbound key under --no-inbox, where middleware.OutboundKey has none.
type noInboxKey struct{}

// outboundKey is the idempotency key of Billing's charge: the inbox's, or --no-inbox's.
func outboundKey(ctx context.Context) (string, bool) {
	if key, ok := middleware.OutboundKey(ctx); ok {
		return key, true
	}
	key, ok := ctx.Value(noInboxKey{}).(string)
	return key, ok
}

// cancelled reports whether the event being handled is an OrderCancelled (the orders topic carries
// both; their payloads have the same shape).
func cancelled(ctx context.Context) bool {
	msg, ok := handlers.MessageFrom(ctx)
	return ok && outboxkit.EventType(msg) == "OrderCancelled"
}

// waitRunning waits until the router has subscribed every handler.
func waitRunning(ctx context.Context, router *message.Router) error {
	select {
	case <-router.Running():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("the consumers did not start within 30s")
	}
}
