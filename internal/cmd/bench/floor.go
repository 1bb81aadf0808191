package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// logFloor measures what the pipeline's stages cannot go below on this machine, at 1,000/s: a
// Postgres COMMIT of one small INSERT on the logical cluster (its WAL flush), and RabbitMQ's
// publish → confirm and publish → delivery of a persistent message to a durable queue.
func logFloor(ctx context.Context, c config, _ *pgxpool.Pool) ([]series, error) {
	const perSec = 1000
	d := min(c.e2eFor, 15*time.Second)
	fmt.Printf("\nlog, floors at %d/s for %s: %s\n", perSec, d, loadAverage())
	pg, err := floorCommit(ctx, c.logDBURL, perSec, d)
	if err != nil {
		return nil, fmt.Errorf("postgres floor: %w", err)
	}
	mq, err := floorBroker(ctx, c.brokerURL, perSec, d)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq floor: %w", err)
	}
	fmt.Printf("  after: %s\n", loadAverage())
	var out []series
	for _, f := range append(pg, mq...) {
		fmt.Printf("  %-60s p50 %6.2f ms  p90 %6.2f ms  p99 %6.2f ms  (%d)\n", f.name, ms(percentile(f.d, 50)), ms(percentile(f.d, 90)), ms(percentile(f.d, 99)), len(f.d))
		out = append(out, series{Name: f.name + ", p50", Unit: "ms", Values: []float64{ms(percentile(f.d, 50))}},
			series{Name: f.name + ", p99", Unit: "ms", Values: []float64{ms(percentile(f.d, 99))}})
	}
	return out, nil
}

// floorCommit runs BEGIN; INSERT one small row; COMMIT at perSec from 4 clients.
func floorCommit(ctx context.Context, url string, perSec int, d time.Duration) ([]stage, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS bench_floor; CREATE TABLE bench_floor (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text NOT NULL)`); err != nil {
		return nil, err
	}
	defer func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS bench_floor`) }()
	commit := stage{name: "Postgres COMMIT of one small INSERT (4 clients)"}
	whole := stage{name: "Postgres BEGIN + INSERT + COMMIT (4 clients)"}
	var mu sync.Mutex
	slots := make(chan struct{}, perSec)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range slots {
				t0 := time.Now()
				tx, err := pool.Begin(ctx)
				if err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO bench_floor (v) VALUES ('x')`)
				}
				t1 := time.Now()
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
				t2 := time.Now()
				mu.Lock()
				commit.d = append(commit.d, t2.Sub(t1))
				whole.d = append(whole.d, t2.Sub(t0))
				mu.Unlock()
			}
		}()
	}
	pace(perSec, d, func() { slots <- struct{}{} })
	close(slots)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	return []stage{commit, whole}, nil
}

// pace calls f perSec times a second for d, on a fixed schedule.
func pace(perSec int, d time.Duration, f func()) {
	start := time.Now()
	for i := range int(float64(perSec) * d.Seconds()) {
		if wait := time.Until(start.Add(time.Duration(float64(i) / float64(perSec) * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		f()
	}
}

// floorBroker publishes persistent messages to a durable queue at perSec on one confirm-mode
// channel (pipelined: each publish waits for nothing), and consumes them with manual acks on
// another connection.
func floorBroker(ctx context.Context, url string, perSec int, d time.Duration) ([]stage, error) {
	pconn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	defer pconn.Close()
	cconn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	defer cconn.Close()
	pch, err := pconn.Channel()
	if err != nil {
		return nil, err
	}
	if err := pch.Confirm(false); err != nil {
		return nil, err
	}
	queue := fmt.Sprintf("bench.floor.%d", time.Now().UnixNano())
	if _, err := pch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return nil, err
	}
	defer func() { _, _ = pch.QueueDelete(queue, false, false, false) }()
	cch, err := cconn.Channel()
	if err != nil {
		return nil, err
	}
	if err := cch.Qos(100, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := cch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	var (
		mu        sync.Mutex
		sent      = map[string]time.Time{}
		confirm   = stage{name: "RabbitMQ publish → confirm, persistent, durable queue"}
		deliver   = stage{name: "RabbitMQ publish → delivered to a consumer"}
		confirmWG sync.WaitGroup
	)
	n := int(float64(perSec) * d.Seconds())
	got := make(chan struct{})
	go func() {
		i := 0
		for dl := range deliveries {
			now := time.Now()
			mu.Lock()
			if t0, ok := sent[dl.MessageId]; ok {
				deliver.d = append(deliver.d, now.Sub(t0))
			}
			mu.Unlock()
			_ = dl.Ack(false)
			if i++; i == n {
				close(got)
			}
		}
	}()
	body := make([]byte, 200)
	var perr error
	i := 0
	pace(perSec, d, func() {
		if perr != nil {
			return
		}
		id := fmt.Sprint("m-", i)
		i++
		t0 := time.Now()
		mu.Lock()
		sent[id] = t0
		mu.Unlock()
		dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			perr = err
			return
		}
		confirmWG.Add(1)
		go func() {
			defer confirmWG.Done()
			<-dc.Done()
			now := time.Now()
			mu.Lock()
			confirm.d = append(confirm.d, now.Sub(t0))
			mu.Unlock()
		}()
	})
	if perr != nil {
		return nil, perr
	}
	confirmWG.Wait()
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%d of %d delivered after 30s", len(deliver.d), n)
	}
	return []stage{confirm, deliver}, nil
}
