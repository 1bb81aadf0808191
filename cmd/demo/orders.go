package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit"
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
	b           *business
	topic       string
	poisonEvery int64 // every Nth order's event gets a payload no consumer can decode
	// poisonCustomer's orders' events get a payload no consumer can decode.
	poisonCustomer string
	placed         atomic.Int64
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
	tx, ok, done := s.begin(w, r)
	if done {
		return
	}
	order := OrderPlaced{OrderID: "o-" + uuid.Must(uuid.NewV7()).String(), Customer: in.Customer, TotalCents: in.TotalCents}
	if err := s.write(ctx, tx, order); err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !ok {
		if err := tx.Commit(); err != nil {
			writeProblem(w, http.StatusInternalServerError, "commit: "+err.Error())
			return
		}
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": order.OrderID, "status": "placed"})
}

// begin returns the request's transaction: with an Idempotency-Key, the one the idempotency
// middleware began (the order commits together with the recorded response, ok is true); without,
// a transaction of its own, rolled back when the request ends unless committed. done is true when
// it answered the request with an error.
func (s *orderService) begin(w http.ResponseWriter, r *http.Request) (tx *sql.Tx, ok, done bool) {
	ctx := r.Context()
	tx, ok, err := outboxkit.TxFrom[*sql.Tx](ctx)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return nil, false, true
	}
	if ok {
		return tx, true, false
	}
	// database/sql rolls the transaction back when the request's context ends, unless committed.
	tx, err = s.b.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "database unavailable: "+err.Error())
		return nil, false, true
	}
	return tx, false, false
}

// write inserts the order and publishes its event into the outbox in tx.
//
// The order's row is written first: for a new aggregate the INSERT is the lock — a concurrent
// writer of the same id waits on its key until this transaction ends — so the outbox row, written
// after it, takes its place in the key's order behind everything committed before.
func (s *orderService) write(ctx context.Context, tx *sql.Tx, o OrderPlaced) error {
	if _, err := tx.ExecContext(ctx, s.b.q(`INSERT INTO {{t}}.orders (id, customer, total_cents, created_at) VALUES (?, ?, ?, ?)`),
		o.OrderID, o.Customer, o.TotalCents, s.b.now()); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	msg, err := pipeline.NewJSONEvent("OrderPlaced", o.OrderID, o)
	if err != nil {
		return err
	}
	outboxkit.SetVersion(msg, 1)
	if n := s.placed.Add(1); (s.poisonEvery > 0 && n%s.poisonEvery == 0) || (s.poisonCustomer != "" && o.Customer == s.poisonCustomer) {
		msg.Payload = []byte("not json") // --poison-every, --poison-customer: consumers dead-letter it
	}
	return s.publish(ctx, tx, msg)
}

func (s *orderService) publish(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
	msg.SetContext(ctx) // the request's trace context is stored with the row
	pub, err := pipeline.NewPublisher(s.b.db, tx, pipeline.PublisherConfig{})
	if err != nil {
		return err
	}
	return pub.Publish(s.topic, msg)
}

// cancel is POST /orders/{id}/cancel: an update of an existing aggregate. Its row is locked and its
// version bumped by the UPDATE before the event is written, so two concurrent changes of one order
// commit their events in the order of their versions: the second waits for the first's lock, then
// sees its version. (The UPDATE, then a read in the same transaction: MySQL has no UPDATE …
// RETURNING.)
func (s *orderService) cancel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok, done := s.begin(w, r)
	if done {
		return
	}
	o := OrderPlaced{OrderID: r.PathValue("id")}
	res, err := tx.ExecContext(ctx, s.b.q(`UPDATE {{t}}.orders SET status = 'cancelled', version = version + 1
		WHERE id = ? AND status = 'placed'`), o.OrderID)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	if n == 0 {
		writeProblem(w, http.StatusConflict, "no placed order "+o.OrderID+" to cancel (unknown, or cancelled already)")
		return
	}
	var version int64
	if err := tx.QueryRowContext(ctx, s.b.q(`SELECT version, customer, total_cents FROM {{t}}.orders WHERE id = ?`), o.OrderID).
		Scan(&version, &o.Customer, &o.TotalCents); err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	msg, err := pipeline.NewJSONEvent("OrderCancelled", o.OrderID, o)
	if err == nil {
		outboxkit.SetVersion(msg, version)
		err = s.publish(ctx, tx, msg)
	}
	if err == nil && !ok {
		err = tx.Commit()
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
	db := s.b.db.SQL
	err := db.QueryRowContext(ctx, s.b.q(`SELECT customer, total_cents, created_at FROM {{t}}.orders WHERE id = ?`), id).
		Scan(&customer, &total, &created)
	if errors.Is(err, sql.ErrNoRows) {
		writeProblem(w, http.StatusNotFound, "no order "+id)
		return
	}
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if b, isBytes := created.([]byte); isBytes {
		created = string(b)
	}
	v.Order = map[string]any{"id": id, "customer": customer, "total_cents": total, "created_at": created}

	var uuidStr, state string
	var attempts int
	var lastError *string
	err = db.QueryRowContext(ctx, s.b.q(`SELECT uuid, CASE WHEN published_at IS NOT NULL THEN 'published'
			WHEN dead_lettered_at IS NOT NULL THEN 'dead-lettered' ELSE 'pending' END, attempts, last_error
		FROM {{t}}.outbox WHERE partition_key = ? ORDER BY seq LIMIT 1`), id).Scan(&uuidStr, &state, &attempts, &lastError)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		v.Event = map[string]any{"state": "pruned (published and past retention)"}
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, err.Error())
		return
	default:
		v.Event = map[string]any{"uuid": uuidStr, "state": state, "attempts": attempts, "last_error": lastError}
	}

	v.Consumers = map[string]map[string]any{}
	for _, c := range consumerNames {
		var done, dead int
		_ = db.QueryRowContext(ctx, s.b.q(`SELECT count(*) FROM {{t}}.`+c.table+` WHERE order_id = ?`), id).Scan(&done)
		_ = db.QueryRowContext(ctx, s.b.q(`SELECT count(*) FROM {{t}}.dead_letters WHERE consumer = ? AND message_id = ? AND replayed_at IS NULL`),
			c.name, uuidStr).Scan(&dead)
		status := "waiting"
		switch {
		case done > 0:
			status = c.effect
		case dead > 0:
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
