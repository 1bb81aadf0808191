package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// benchIdle measures what an idle pipeline costs: a relay (woken by NOTIFY, 1s poll) and a batch
// consumer on RabbitMQ, after some traffic, left without any for c.idleFor. It reports the CPU of
// this process (relay and consumer) and of the Postgres sessions they hold, in cores.
func benchIdle(ctx context.Context, c config) ([]series, error) {
	app := fmt.Sprintf("outboxkit-bench-idle-%d", os.Getpid())
	cfg, err := pgxpool.ParseConfig(c.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	schema, drop, err := newSchema(ctx, pool, "bench_idle")
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.effects (message_id text PRIMARY KEY)`); err != nil {
		return nil, err
	}
	st := storeIn(pool, schema, pgxstore.Config{})
	topic, group := "bench.idle."+schema, "idle"
	if err := declareQueues(c.brokerURL, []string{topic}, group); err != nil {
		return nil, err
	}
	defer deleteQueues(c.brokerURL, []string{topic}, group)
	fmt.Printf("\nidle: a relay and a batch consumer, after 200 events, without traffic for %s\n", c.idleFor)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: c.brokerURL})
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: pub, Name: "idle"})
	if err != nil {
		return nil, err
	}
	sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: c.brokerURL, Consumer: group, Unacked: consumerBatch})
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	applied := make(chan struct{}, 1000)
	consumer, err := middleware.NewBatchConsumer(middleware.BatchConfig{StackConfig: middleware.StackConfig{Store: st, Consumer: group}},
		sub, topic, middleware.NoPublish(handlers.JSON(func(ctx context.Context, tx pgx.Tx, o map[string]any) error {
			msg, _ := handlers.MessageFrom(ctx)
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (message_id) VALUES ($1)`, msg.UUID)
			applied <- struct{}{}
			return err
		})))
	if err != nil {
		return nil, err
	}
	done := make(chan struct{}, 2)
	go func() { _ = relay.Run(runCtx); done <- struct{}{} }()
	go func() { _ = consumer.Run(runCtx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	if err := started(relay.Running(), "relay"); err != nil {
		return nil, err
	}
	if err := started(consumer.Running(), "consumer"); err != nil {
		return nil, err
	}
	for i := 0; i < 200; i++ { // traffic first: connections open, plans cached, as after a busy spell
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		p, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
		body, key := payload(i, c.keys)
		if err := p.Publish(topic, pipeline.NewEvent("OrderPlaced", key, body)); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
	}
	for i := 0; i < 200; i++ {
		select {
		case <-applied:
		case <-time.After(60 * time.Second):
			return nil, fmt.Errorf("only %d of 200 warm-up events applied", i)
		}
	}
	time.Sleep(2 * time.Second) // the relay's awake time runs out; then it sleeps

	selfBefore := selfCPU()
	pgBefore, sessions, err := sessionsCPU(ctx, pool, app)
	if err != nil {
		return nil, err
	}
	time.Sleep(c.idleFor)
	selfUsed := selfCPU() - selfBefore
	pgAfter, _, err := sessionsCPU(ctx, pool, app)
	if err != nil {
		return nil, err
	}
	pgUsed := pgAfter - pgBefore
	self := series{Name: "relay and consumer process", Unit: "cores", Values: []float64{selfUsed.Seconds() / c.idleFor.Seconds()}}
	pgs := series{Name: "their Postgres sessions", Unit: "cores", Values: []float64{pgUsed.Seconds() / c.idleFor.Seconds()}}
	total := series{Name: "idle pipeline, in all", Unit: "cores", Values: []float64{self.Values[0] + pgs.Values[0]}}
	fmt.Printf("  CPU over %s without traffic: process %s, its %d Postgres sessions %s\n", c.idleFor, selfUsed, sessions, pgUsed)
	fmt.Print(table("idle cost", []series{self, pgs, total}))
	return []series{self, pgs, total}, nil
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sessionsCPU is the CPU time the Postgres backends named app have used, read from /proc (the
// server runs on this machine); the session asking is left out.
func sessionsCPU(ctx context.Context, pool *pgxpool.Pool, app string) (time.Duration, int, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, app+"%")
	if err != nil {
		return 0, 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, 0, err
	}
	var total time.Duration
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0, fmt.Errorf("read the CPU of Postgres backend %d (is the server on this machine?): %w", pid, err)
		}
		// After the command name in parentheses: state is field 3; utime and stime are 14 and 15.
		fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / 100 // clock ticks of 1/100 s
	}
	return total, len(pids), nil
}
