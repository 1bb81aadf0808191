package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// latencyPublisher records each live row's commit-to-publish latency (rows written by the
// writer carry their write time).
type latencyPublisher struct {
	mu        sync.Mutex
	latencies []time.Duration
	replayed  atomic.Int64
}

func (p *latencyPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if at, err := time.Parse(time.RFC3339Nano, m.Metadata.Get("bench_written_at")); err == nil {
			p.mu.Lock()
			p.latencies = append(p.latencies, time.Since(at))
			p.mu.Unlock()
		} else {
			p.replayed.Add(1)
		}
	}
	return nil
}

func (p *latencyPublisher) Close() error { return nil }

func (p *latencyPublisher) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.latencies
	p.latencies = nil
	return out
}

func p95(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*95/100)]
}

// benchConsoleReplay replays --console-replay outbox dead letters at --console-rate while a
// writer commits 1,000 rows a second and one relay publishes: the job must keep to its rate (or
// wait on backpressure, and say so), and the live rows must not wait much longer than before.
func benchConsoleReplay(ctx context.Context, c config, db *store.DB) ([]series, error) {
	con, _ := store.ConsoleOf(db)
	// The bench's tables change: the next --console-reuse rebuilds them.
	if _, err := db.SQL.ExecContext(ctx, db.Rebind(strings.ReplaceAll(`DELETE FROM {{t}}console_bench_built`, "{{t}}", map[string]string{
		"postgres": `"` + consoleBenchSchema + `".`, "mysql": "`" + consoleBenchSchema + "`.", "sqlite": ""}[db.Dialect]))); err != nil {
		return nil, err
	}
	pub := &latencyPublisher{}
	f, err := forwarder.New(forwarder.Config{Store: db, Publisher: pub, Name: "bench", Retention: forwarder.Retention{Keep: true}})
	if err != nil {
		return nil, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = f.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		t := time.NewTicker(10 * time.Millisecond) // 10 rows every 10 ms: 1,000 a second
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			tx, err := db.SQL.BeginTx(wctx, nil)
			if err != nil {
				continue
			}
			p, _ := pipeline.NewPublisher(db, tx, pipeline.PublisherConfig{})
			var msgs []*message.Message
			for j := 0; j < 10; j++ {
				m := pipeline.NewEvent("OrderPlaced", fmt.Sprintf("live-%d", (i*10+j)%5000), []byte(`{}`))
				m.Metadata.Set("bench_written_at", time.Now().Format(time.RFC3339Nano))
				msgs = append(msgs, m)
			}
			if p.Publish("shop.live", msgs...) == nil {
				_ = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
	}()
	defer func() { stopWriter(); <-writerDone }()
	// The built backlog (4% of the outbox, pending) goes out first, and the live rows that queued
	// behind it: the relay is caught up when a few hundred rows at most wait (a third of a second
	// of the writer's).
	drainStart := time.Now()
	for {
		backlog, capped, err := con.TopicBacklog(ctx, 1000)
		if err != nil {
			return nil, err
		}
		pending := 0
		for _, b := range backlog {
			pending += int(b.Pending)
		}
		if !capped && pending < 300 {
			break
		}
		if time.Since(drainStart) > 10*time.Minute {
			return nil, fmt.Errorf("the relay did not publish the built backlog within 10 minutes")
		}
		if !sleepCtx(ctx, time.Second) {
			return nil, ctx.Err()
		}
	}
	fmt.Printf("  the relay published the built backlog, and caught up with the writer, in %s\n", time.Since(drainStart).Round(time.Second))
	pub.take()
	measure := 20 * time.Second
	fmt.Printf("  bulk replay: writer 1,000 rows/s and a relay for %s, then a replay of up to %d outbox letters at %d/s\n", measure, c.consoleReplay, c.consoleRate)
	if !sleepCtx(ctx, measure) {
		return nil, ctx.Err()
	}
	before := p95(pub.take())
	h, err := console.New(console.Config{Store: db, Auth: console.Auth{LocalOnly: true}, MaxRate: max(c.consoleRate, console.DefaultMaxRate),
		DefaultRate: min(c.consoleRate, console.DefaultRate)})
	if err != nil {
		return nil, err
	}
	// A selection of about --console-replay letters: the oldest, up to a time.
	letters, err := con.ListDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox, Limit: 1})
	if err != nil || len(letters.Letters) == 0 {
		return nil, fmt.Errorf("no outbox letter to replay (%v)", err)
	}
	total, _, err := con.CountDeadLetters(ctx, store.LetterQuery{Side: store.SideOutbox}, -1)
	if err != nil {
		return nil, err
	}
	// Letters are spread evenly over 30 days: take the share that holds about --console-replay.
	span := time.Duration(float64(30*24*time.Hour) * min(1, float64(c.consoleReplay)/float64(total)))
	q := store.LetterQuery{Side: store.SideOutbox, Until: time.Now().Add(-30*24*time.Hour + span + 10*time.Minute)}
	job, _, err := con.CreateJob(ctx, store.NewJob{Kind: store.JobReplay, Filter: q, RequestKey: fmt.Sprintf("bench-%d", time.Now().UnixNano()),
		Rate: c.consoleRate, By: "bench", Now: time.Now()})
	if err != nil {
		return nil, err
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	var waited time.Duration
	lastWaiting := ""
	for {
		j, err := con.Job(ctx, job.ID)
		if err != nil {
			_ = h.Stop(context.Background())
			return nil, err
		}
		if j.Waiting != "" {
			waited += 200 * time.Millisecond
			lastWaiting = j.Waiting
		}
		if !j.Open() || time.Since(start) > time.Duration(float64(job.Total)/float64(c.consoleRate)*3*float64(time.Second))+time.Minute {
			_ = h.Stop(context.Background())
			elapsed := time.Since(start)
			during := p95(pub.take())
			achieved := float64(j.Applied) / elapsed.Seconds()
			fmt.Printf("  job #%d %s: %d of %d letters replayed in %s: %.0f/s (set %d/s); waited on backpressure %s%s\n", j.ID, j.State, j.Applied, j.Total,
				elapsed.Round(time.Second), achieved, c.consoleRate, waited.Round(time.Second), map[bool]string{true: " (" + lastWaiting + ")"}[lastWaiting != ""])
			fmt.Printf("  live rows commit→publish p95: %s before, %s during the replay (replayed rows the relay published: %d)\n",
				before.Round(time.Millisecond), during.Round(time.Millisecond), pub.replayed.Load())
			return []series{
				{Name: "console " + db.Dialect + ": bulk replay rate", Unit: "msg/s", Values: []float64{achieved}},
				{Name: "console " + db.Dialect + ": live p95 before replay", Unit: "ms", Values: []float64{float64(before.Microseconds()) / 1000}},
				{Name: "console " + db.Dialect + ": live p95 during replay", Unit: "ms", Values: []float64{float64(during.Microseconds()) / 1000}},
			}, nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			_ = h.Stop(context.Background())
			return nil, ctx.Err()
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
