package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// The payment gateway is the demo's effect outside its database: Billing charges the order there,
// over HTTP, before it records the invoice. A crash between the two (--crash-after-charge-every)
// redelivers the order, and Billing charges again — with the same Idempotency-Key
// (middleware.OutboundKey: the consumer and the message UUID), which the gateway deduplicates on,
// the way any real gateway does. The gateway is outboxkit's idempotency middleware in front of a
// handler that records the charge, on a database of its own (it stands for another company's
// system; on SQLite a second file, since one SQLite file has one writer and Billing holds it while
// it calls out).

// gatewayCharges has no unique constraint on the order: a double charge would show as two rows.
const gatewayChargesDDL = `CREATE TABLE IF NOT EXISTS {{t}}.gateway_charges (
    charge_id       VARCHAR(64)  PRIMARY KEY,
    order_id        VARCHAR(64)  NOT NULL,
    amount_cents    INTEGER      NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    charged_at      VARCHAR(40)  NOT NULL
)`

// openGateway opens the gateway's database beside the demo's: the schema <schema>_gateway on
// Postgres and MySQL, the file <db>-gateway on SQLite.
func openGateway(ctx context.Context, o options, dialect string) (*store.DB, error) {
	url, ns := o.dbURL, o.schema+"_gateway"
	if dialect == "sqlite" {
		path, query, _ := strings.Cut(o.dbURL, "?")
		url = path + "-gateway"
		if query != "" {
			url += "?" + query
		}
	}
	db, err := store.Open(ctx, url, store.OpenOptions{Schema: ns})
	if err != nil {
		return nil, fmt.Errorf("the payment gateway's database: %w", err)
	}
	if _, err := pipeline.Migrate(ctx, db); err != nil { // its idempotency_keys
		db.Close()
		return nil, fmt.Errorf("the payment gateway's database: %w", err)
	}
	if _, err := db.SQL.ExecContext(ctx, newBusiness(db).q(gatewayChargesDDL)); err != nil {
		db.Close()
		return nil, fmt.Errorf("the payment gateway's table: %w", err)
	}
	return db, nil
}

type chargeRequest struct {
	OrderID     string `json:"order_id"`
	AmountCents int    `json:"amount_cents"`
}

// gatewayHandler serves POST /gateway/charges: an Idempotency-Key is required, and a charge sent
// again with its key is answered from the record, not charged again.
func gatewayHandler(db *store.DB, logger watermill.LoggerAdapter) (http.Handler, error) {
	idem, err := idempotency.Middleware(idempotency.Config{Store: db, Required: true, Logger: logger})
	if err != nil {
		return nil, err
	}
	g := newBusiness(db)
	insert := g.q(`INSERT INTO {{t}}.gateway_charges (charge_id, order_id, amount_cents, idempotency_key, charged_at) VALUES (?, ?, ?, ?, ?)`)
	return idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req chargeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.OrderID == "" || req.AmountCents <= 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `send {"order_id": "…", "amount_cents": n > 0}`})
			return
		}
		tx, ok, err := outboxkit.TxFrom[*sql.Tx](r.Context())
		if !ok || err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "no transaction for the charge"})
			return
		}
		id := uuid.NewString()
		if _, err := tx.ExecContext(r.Context(), insert, id, req.OrderID, req.AmountCents, r.Header.Get(idempotency.Header),
			time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusCreated, map[string]string{"charge_id": id})
	})), nil
}

// gatewayClient is Billing's side of the gateway.
type gatewayClient struct {
	url  string
	http *http.Client
}

// charge asks the gateway to charge the order, with key as its Idempotency-Key. A refusal of the
// request itself (4xx) is permanent: sending it again cannot help. Anything else — the gateway
// unreachable, a 5xx, a 409 while the same key is still in progress — fails the delivery, which is
// retried with the same key.
func (g *gatewayClient) charge(ctx context.Context, key string, req chargeRequest) error {
	body, _ := json.Marshal(req)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set(idempotency.Header, key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := g.http.Do(r)
	if err != nil {
		return fmt.Errorf("payment gateway: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusConflict:
		return handlers.Permanent(fmt.Errorf("payment gateway refused the charge of order %s: %d %s", req.OrderID, resp.StatusCode, msg))
	}
	return fmt.Errorf("payment gateway: %d %s", resp.StatusCode, msg)
}

// crashAfterCharge is --crash-after-charge-every: the process dies between the gateway's charge
// and the invoice's commit, as a real crash would (exit status 3).
func crashAfterCharge(orderID string, every int64) {
	fmt.Fprintf(os.Stderr, "demo: crashing after charging order %s, before its invoice commits (--crash-after-charge-every %d)\n", orderID, every)
	os.Exit(3)
}
