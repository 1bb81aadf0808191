// Command bench measures outboxkit beside stock Watermill and the broker's own limit, in one run,
// against the local Postgres and RabbitMQ. Every figure is the median of several repetitions;
// every comparison is a ratio of two figures measured in the same round.
//
//	go run ./cmd/bench [--scenario drain|consumer|backends|all] [--events 20000] [--keys 200] [--reps 3]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"time"
)

type config struct {
	dbURL, brokerURL string
	events, keys     int
	reps             int
	jsonPath         string
	cpuProfile       string
	batch, inFlight  int
	relays           int
	scenario         string
	consumerEvents   int
	backendURLs      string
}

func main() {
	var c config
	flag.StringVar(&c.dbURL, "db", env("OUTBOXKIT_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL")
	flag.StringVar(&c.brokerURL, "broker", env("OUTBOXKIT_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.IntVar(&c.events, "events", 20000, "events preloaded for each drain")
	flag.IntVar(&c.keys, "keys", 200, "partition keys the events are spread over")
	flag.IntVar(&c.reps, "reps", 3, "repetitions of each measurement (the median is reported)")
	flag.StringVar(&c.jsonPath, "json", "bench-results/bench.json", "where to write the figures as JSON (empty: nowhere)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the outboxkit drains to this file")
	flag.IntVar(&c.batch, "batch", 0, "forwarder BatchSize (0: the default)")
	flag.IntVar(&c.inFlight, "inflight", 0, "forwarder MaxInFlight (0: the default)")
	flag.IntVar(&c.relays, "relays", 1, "forwarders draining the outbox at once")
	flag.StringVar(&c.scenario, "scenario", "all", "what to measure: drain, consumer, backends or all")
	flag.StringVar(&c.backendURLs, "backends", defaultBackendURLs, "comma-separated broker URLs for --scenario backends")
	flag.IntVar(&c.consumerEvents, "consumer-events", 5000, "messages preloaded for each consumer measurement")
	flag.Parse()
	if c.events < 1 || c.keys < 1 || c.reps < 1 {
		fmt.Fprintln(os.Stderr, "bench: --events, --keys and --reps must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	fmt.Printf("outboxkit bench — %s, %d CPUs, %s\n", runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	var results []series
	if c.scenario == "drain" || c.scenario == "all" {
		r, err := benchDrain(ctx, c)
		if err != nil {
			return err
		}
		results = append(results, r...)
	}
	if c.scenario == "consumer" || c.scenario == "all" {
		r, err := benchConsumer(ctx, c)
		if err != nil {
			return err
		}
		results = append(results, r...)
	}
	if c.scenario == "backends" || c.scenario == "all" {
		r, err := benchBackends(ctx, c)
		if err != nil {
			return err
		}
		results = append(results, r...)
	}
	if len(results) == 0 {
		return fmt.Errorf("unknown --scenario %q: use drain, consumer, backends or all", c.scenario)
	}
	if c.jsonPath != "" {
		if err := os.MkdirAll(filepath.Dir(c.jsonPath), 0o755); err != nil {
			return err
		}
		out, _ := json.MarshalIndent(map[string]any{
			"when": time.Now().UTC(), "cpus": runtime.NumCPU(), "events": c.events, "keys": c.keys,
			"reps": c.reps, "series": results,
		}, "", "  ")
		if err := os.WriteFile(c.jsonPath, out, 0o644); err != nil {
			return err
		}
		fmt.Printf("\nfigures written to %s\n", c.jsonPath)
	}
	return nil
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
