package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outboxkit/idempotency"
)

// poisonCustomer's orders get an event no consumer can decode (the demo's --poison-customer).
const poisonCustomer = "poison"

// ledger is what the clients were told: every answer, by Idempotency-Key.
type ledger struct {
	mu        sync.Mutex
	placed    map[string][]string // key → the order id of each 2xx answer
	poisoned  map[string]bool     // key → its order is a poisoned one
	cancelled map[string]bool     // order id → its cancel was answered 200
	cancelKey map[string]string   // order id → the key of its cancel
	refused   []string            // definitive refusals (4xx) of requests that should have succeeded
	unsettled map[string]bool     // keys (placing and cancelling) still without a definitive answer

	posts, retries, repeats, replayed atomic.Int64
}

func newLedger() *ledger {
	return &ledger{placed: map[string][]string{}, poisoned: map[string]bool{}, cancelled: map[string]bool{},
		cancelKey: map[string]string{}, unsettled: map[string]bool{}}
}

func (l *ledger) settle(key string, done bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if done {
		delete(l.unsettled, key)
	} else {
		l.unsettled[key] = true
	}
}

// client offers orders to the order service the way a careful client does: an Idempotency-Key per
// operation, and every request that got no definitive answer sent again with it, with backoff,
// until answered or giveUp.
type client struct {
	base   string
	http   *http.Client
	l      *ledger
	rnd    func() float64
	o      options
	giveUp time.Time
	wg     sync.WaitGroup
}

// offer places orders at o.rate until ctx ends (the end of the load phase).
func (c *client) offer(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / c.o.rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		customer := fmt.Sprintf("customer-%d", i%997)
		poison := c.rnd() < float64(c.o.poisonPercent)/100
		if poison {
			customer = poisonCustomer
		}
		key := uuid.NewString()
		body := []byte(fmt.Sprintf(`{"customer":%q,"total_cents":%d}`, customer, 100+i%50000))
		c.l.mu.Lock()
		c.l.poisoned[key] = poison
		c.l.mu.Unlock()
		repeat := c.rnd() < float64(c.o.retryPercent)/100
		cancel := !poison && c.rnd() < float64(c.o.cancelPercent)/100
		atOnce := c.rnd() < 0.5
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if repeat && atOnce {
				c.l.repeats.Add(1)
				c.wg.Add(1)
				go func() { defer c.wg.Done(); c.place(key, body) }()
			}
			id := c.place(key, body)
			if repeat && !atOnce {
				c.l.repeats.Add(1)
				c.place(key, body)
			}
			if cancel && id != "" {
				c.cancel(id)
			}
		}()
	}
}

// place POSTs /orders with key until a definitive answer; it returns the order id answered.
func (c *client) place(key string, body []byte) string {
	var id string
	c.send(key, "/orders", body, func(status int, resp []byte) bool {
		if status != http.StatusCreated {
			return false
		}
		var v struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(resp, &v) != nil || v.ID == "" {
			return false
		}
		id = v.ID
		c.l.mu.Lock()
		c.l.placed[key] = append(c.l.placed[key], v.ID)
		c.l.mu.Unlock()
		return true
	})
	return id
}

// cancel POSTs /orders/{id}/cancel with a key of its own until a definitive answer.
func (c *client) cancel(id string) {
	key := uuid.NewString()
	c.l.mu.Lock()
	c.l.cancelKey[id] = key
	c.l.mu.Unlock()
	c.send(key, "/orders/"+id+"/cancel", nil, func(status int, _ []byte) bool {
		if status != http.StatusOK {
			return false
		}
		c.l.mu.Lock()
		c.l.cancelled[id] = true
		c.l.mu.Unlock()
		return true
	})
}

// send sends one operation until ok accepts an answer or the answer is a definitive refusal
// (4xx other than 409 "in progress"), retrying network errors and 5xx with backoff.
func (c *client) send(key, path string, body []byte, ok func(status int, resp []byte) bool) {
	c.l.settle(key, false)
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.l.retries.Add(1)
			time.Sleep(backoff + time.Duration(rand.Int64N(int64(backoff/2))))
			backoff = min(backoff*2, 2*time.Second)
		}
		if time.Now().After(c.giveUp) {
			return // unsettled: the checker reports it
		}
		c.l.posts.Add(1)
		req, _ := http.NewRequest(http.MethodPost, c.base+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idempotency.Header, key)
		resp, err := c.http.Do(req)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if idempotency.Replayed(resp) {
			c.l.replayed.Add(1)
		}
		if ok(resp.StatusCode, b) {
			c.l.settle(key, true)
			return
		}
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict {
			c.l.mu.Lock()
			c.l.refused = append(c.l.refused, fmt.Sprintf("POST %s (key %s): %d %s", path, key, resp.StatusCode, bytes.TrimSpace(b)))
			c.l.mu.Unlock()
			c.l.settle(key, true)
			return
		}
		if resp.StatusCode == http.StatusConflict && body == nil && !idempotency.Replayed(resp) {
			// The cancel handler's own 409: the order was not in state placed. A cancel that
			// committed and lost its answer is replayed (200), never 409, so this is a refusal.
			c.l.mu.Lock()
			c.l.refused = append(c.l.refused, fmt.Sprintf("POST %s (key %s): %d %s", path, key, resp.StatusCode, bytes.TrimSpace(b)))
			c.l.mu.Unlock()
			c.l.settle(key, true)
			return
		}
	}
}
