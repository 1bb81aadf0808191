package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/idempotency"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// A POST retried with the same Idempotency-Key places one order: the handler writes the order and
// its event in the transaction the middleware gives it, which also records the response; the retry
// gets that response again.
func ExampleMiddleware() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := pipeline.Migrate(ctx, st); err != nil {
		log.Fatal(err)
	}
	if _, err := st.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)`); err != nil {
		log.Fatal(err)
	}

	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok, err := outboxkit.TxFrom[*sql.Tx](r.Context()) // pgx.Tx with store/pgxstore
		if err != nil || !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		res, err := tx.ExecContext(r.Context(), `INSERT INTO orders (body) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // 5xx: nothing recorded, a retry runs again
			return
		}
		id, _ := res.LastInsertId()
		pub, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
		msg, _ := pipeline.NewJSONEvent("OrderPlaced", fmt.Sprint(id), map[string]any{"id": id})
		if err := pub.Publish("orders", msg); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", id)
	})
	mw, err := idempotency.Middleware(idempotency.Config{Store: st, Required: true})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw(placeOrder))
	defer srv.Close()

	for range 2 { // the client retries, with the same key and body
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"customer":"ada"}`))
		req.Header.Set(idempotency.Header, "7f1c2a9e-order-ada")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", idempotency.Replayed(resp))
	}
	var orders, events int
	_ = st.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&orders)
	_ = st.DB().QueryRow(`SELECT count(*) FROM outbox_messages`).Scan(&events)
	fmt.Println("orders", orders, "events", events)
	// Output:
	// 201 order 1 replayed: false
	// 201 order 1 replayed: true
	// orders 1 events 1
}
