package main

import (
	"bytes"
	"context"
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

type generated struct {
	placed, retried, replayed int
}

// placeSampleOrders POSTs o.orders orders at o.rate per second. A share of them is sent twice with
// the same Idempotency-Key — half of those at the same time — as a client retrying would.
func placeSampleOrders(ctx context.Context, base string, o options) (generated, error) {
	var (
		g        generated
		replayed atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(key string, body []byte) {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idempotency.Header, key)
		resp, err := client.Do(req)
		if err == nil && resp.StatusCode != http.StatusCreated {
			msg, _ := io.ReadAll(resp.Body)
			err = fmt.Errorf("POST /orders: %d %s", resp.StatusCode, msg)
		}
		if err != nil {
			errOnce.Do(func() { firstErr = err })
			return
		}
		if idempotency.Replayed(resp) {
			replayed.Add(1)
		}
		resp.Body.Close()
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
	defer tick.Stop()
	for i := 0; i < o.orders; i++ {
		select {
		case <-ctx.Done():
			return g, ctx.Err()
		case <-tick.C:
		}
		key := uuid.NewString()
		body := []byte(fmt.Sprintf(`{"customer":"customer-%d","total_cents":%d}`, rand.IntN(1000), 100+rand.IntN(50000)))
		wg.Add(1)
		go post(key, body)
		if rand.IntN(100) < o.retryPercent {
			g.retried++
			wg.Add(1)
			if g.retried%2 == 0 {
				go post(key, body) // at the same time as the first
			} else {
				go func() { time.Sleep(50 * time.Millisecond); post(key, body) }() // a retry shortly after
			}
		}
		g.placed++
	}
	wg.Wait()
	g.replayed = int(replayed.Load())
	return g, firstErr
}
