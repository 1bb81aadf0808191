package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/idempotency"
)

// Billing charges the payment gateway over HTTP before it records the invoice, and the demo
// process exits after every 4th charge, before the invoice commits — a real crash, restarted each
// time as a supervisor would. The redelivered order is charged again with the same
// Idempotency-Key (the consumer and the message UUID), so the gateway charges every order exactly
// once, and Billing invoices it once.
func TestDemo_CrashAfterChargeChargesEveryOrderOnce(t *testing.T) {
	t.Parallel()
	pg, url, gateway := newDemoEnv(t)

	const orders = 24
	keys := make([]string, orders)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	placed := map[int]bool{}
	crashes := 0
	d := startDemo(t, pg, url, "--crash-after-charge-every", "4")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		// A client placing its orders, each POST sent again with its key until it is answered.
		for i, key := range keys {
			if !placed[i] && tryPlaceOrder(d.url, key, fmt.Sprintf("customer-%d", i)) == http.StatusCreated {
				placed[i] = true
			}
		}
		if len(placed) == orders && pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices`) == orders {
			break
		}
		select {
		case <-d.exited:
			if code := d.cmd.ProcessState.ExitCode(); code != 3 || !strings.Contains(d.log(), "crashing after charging order") {
				t.Fatalf("the demo exited with status %d, not the charge crash's 3:\n%s", code, d.log())
			}
			crashes++
			d = startDemo(t, pg, url, "--crash-after-charge-every", "4")
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3 minutes and %d crashes: %d of %d orders placed, %d invoiced:\n%s", crashes, len(placed), orders,
				pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices`), d.log())
		}
	}
	if crashes < 2 {
		t.Fatalf("only %d crashes after a charge: the fault did not fire", crashes)
	}
	charges := map[string]int{}
	rows, err := pg.Pool.Query(context.Background(), `SELECT order_id, count(*) FROM `+gateway+`.gateway_charges GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		charges[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	invoiced := pg.Int(t, `SELECT count(*) FROM {{schema}}.invoices WHERE order_id IN (SELECT id FROM {{schema}}.orders)`)
	for id, n := range charges {
		if n != 1 {
			t.Errorf("order %s charged %d times at the gateway", id, n)
		}
	}
	if len(charges) != orders || invoiced != orders {
		t.Fatalf("%d orders charged, %d invoiced; want %d each", len(charges), invoiced, orders)
	}
	t.Logf("%d orders charged once each across %d crashes between a charge and its invoice", orders, crashes)
}

// tryPlaceOrder POSTs an order with its Idempotency-Key; 0 when the service did not answer.
func tryPlaceOrder(base, key, customer string) int {
	req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(fmt.Sprintf(`{"customer":%q,"total_cents":1250}`, customer)))
	req.Header.Set(idempotency.Header, key)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
