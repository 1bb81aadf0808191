package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/pipeline"
)

// OrderPlaced is the event the order service publishes and the consumers handle.
type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int    `json:"total_cents"`
}

type placeOrder struct {
	Customer   string `json:"customer"`
	TotalCents int    `json:"total_cents"`
}

// orderService writes an order and its OrderPlaced event in one transaction.
type orderService struct {
	pool        *pgxpool.Pool
	schema      string
	topic       string
	poisonEvery int64 // every Nth order's event gets a payload no consumer can decode
	placed      atomic.Int64
}

func (s *orderService) create(w http.ResponseWriter, r *http.Request) {
	var in placeOrder
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeProblem(w, http.StatusBadRequest, "the body must be JSON like {\"customer\":\"ada\",\"total_cents\":1250}: "+err.Error())
		return
	}
	if strings.TrimSpace(in.Customer) == "" || in.TotalCents <= 0 {
		writeProblem(w, http.StatusBadRequest, "customer must be non-empty and total_cents positive")
		return
	}
	ctx := r.Context()
	// With an Idempotency-Key the order commits together with the recorded response.
	tx, ok := idempotency.TxFrom(ctx)
	if !ok {
		own, err := s.pool.Begin(ctx)
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "database unavailable")
			return
		}
		defer func() { _ = own.Rollback(context.WithoutCancel(ctx)) }()
		tx = own
	}
	order := OrderPlaced{OrderID: "o-" + uuid.Must(uuid.NewV7()).String(), Customer: in.Customer, TotalCents: in.TotalCents}
	if err := s.write(ctx, tx, order); err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !ok {
		if err := tx.Commit(ctx); err != nil {
			writeProblem(w, http.StatusInternalServerError, "commit: "+err.Error())
			return
		}
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": order.OrderID, "status": "placed"})
}

// write inserts the order and publishes its event into the outbox in tx.
//
// The order's row is written first: for a new aggregate the INSERT is the lock — a concurrent
// writer of the same id waits on its key until this transaction ends — so the outbox row, written
// after it, takes its place in the key's order behind everything committed before.
func (s *orderService) write(ctx context.Context, tx pgx.Tx, o OrderPlaced) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.schema+`.orders (id, customer, total_cents) VALUES ($1, $2, $3)`,
		o.OrderID, o.Customer, o.TotalCents); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	msg, err := pipeline.NewJSONEvent("OrderPlaced", o.OrderID, o)
	if err != nil {
		return err
	}
	outboxkit.SetVersion(msg, 1)
	if n := s.placed.Add(1); s.poisonEvery > 0 && n%s.poisonEvery == 0 {
		msg.Payload = []byte("not json") // --poison-every: consumers quarantine it
	}
	return s.publish(ctx, tx, msg)
}

func (s *orderService) publish(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	msg.SetContext(ctx) // the request's trace context is stored with the row
	pub, err := pipeline.NewPgxPublisher(tx, pipeline.PublisherConfig{Schema: s.schema})
	if err != nil {
		return err
	}
	return pub.Publish(s.topic, msg)
}

// cancel is POST /orders/{id}/cancel: an update of an existing aggregate. Its row is locked and its
// version bumped by the UPDATE before the event is written, so two concurrent changes of one order
// commit their events in the order of their versions: the second waits for the first's lock, then
// sees its version.
func (s *orderService) cancel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok := idempotency.TxFrom(ctx)
	if !ok {
		own, err := s.pool.Begin(ctx)
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "database unavailable")
			return
		}
		defer func() { _ = own.Rollback(context.WithoutCancel(ctx)) }()
		tx = own
	}
	o := OrderPlaced{OrderID: r.PathValue("id")}
	var version int64
	err := tx.QueryRow(ctx, `UPDATE `+s.schema+`.orders SET status = 'cancelled', version = version + 1
		WHERE id = $1 AND status = 'placed' RETURNING version, customer, total_cents`, o.OrderID).Scan(&version, &o.Customer, &o.TotalCents)
	if errors.Is(err, pgx.ErrNoRows) {
		writeProblem(w, http.StatusConflict, "no placed order "+o.OrderID+" to cancel (unknown, or cancelled already)")
		return
	}
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	msg, err := pipeline.NewJSONEvent("OrderCancelled", o.OrderID, o)
	if err == nil {
		outboxkit.SetVersion(msg, version)
		err = s.publish(ctx, tx, msg)
	}
	if err == nil && !ok {
		err = tx.Commit(ctx)
	}
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": o.OrderID, "status": "cancelled", "version": version})
}

// orderView is GET /orders/{id}: the order, its event's state in the outbox and what each
// consumer did with it.
type orderView struct {
	Order     map[string]any            `json:"order"`
	Event     map[string]any            `json:"event"`
	Consumers map[string]map[string]any `json:"consumers"`
}

func (s *orderService) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx := r.Context()
	var v orderView
	var customer string
	var total int
	var created any
	err := s.pool.QueryRow(ctx, `SELECT customer, total_cents, created_at FROM `+s.schema+`.orders WHERE id = $1`, id).
		Scan(&customer, &total, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		writeProblem(w, http.StatusNotFound, "no order "+id)
		return
	}
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	v.Order = map[string]any{"id": id, "customer": customer, "total_cents": total, "created_at": created}

	var uuidStr, state string
	var attempts int
	var lastError *string
	err = s.pool.QueryRow(ctx, `SELECT uuid, CASE WHEN published_at IS NOT NULL THEN 'published'
			WHEN dead_lettered_at IS NOT NULL THEN 'dead-lettered' ELSE 'pending' END, attempts, last_error
		FROM `+s.schema+`.outbox WHERE partition_key = $1 ORDER BY seq LIMIT 1`, id).Scan(&uuidStr, &state, &attempts, &lastError)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		v.Event = map[string]any{"state": "pruned (published and past retention)"}
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, err.Error())
		return
	default:
		v.Event = map[string]any{"uuid": uuidStr, "state": state, "attempts": attempts, "last_error": lastError}
	}

	v.Consumers = map[string]map[string]any{}
	for _, c := range consumerNames {
		var done, dead bool
		_ = s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.schema+`.`+c.table+` WHERE order_id = $1)`, id).Scan(&done)
		_ = s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.schema+`.dead_letters WHERE consumer = $1 AND message_id = $2 AND replayed_at IS NULL)`,
			c.name, uuidStr).Scan(&dead)
		status := "waiting"
		switch {
		case done:
			status = c.effect
		case dead:
			status = "dead-lettered"
		}
		v.Consumers[c.name] = map[string]any{"status": status}
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "title": http.StatusText(status), "detail": detail})
}
