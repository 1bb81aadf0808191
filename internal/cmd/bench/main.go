// Command bench measures outboxkit beside stock Watermill and the broker's own limit, in one run,
// against the local Postgres and RabbitMQ. Every figure is the median of several repetitions;
// every comparison is a ratio of two figures measured in the same round.
//
//	go run ./internal/cmd/bench [--scenario write|drain|e2e|consumer|scale|claim|backends|idle|console|log|binlog|fleet|kafka-txn|all] [--reps 3]
//	                            [--store postgres|mysql|sqlite] (the drain and write scenarios' store)
//	                            [--json bench-results/bench.json] [--compare an-earlier-run.json]
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
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	dbURL, brokerURL string
	store, mysqlURL  string
	events, keys     int
	reps             int
	jsonPath         string
	comparePath      string
	cpuProfile       string
	batch, inFlight  int
	relays           int
	scenario         string
	consumerEvents   int
	consumerKinds    string
	backendURLs      string
	writeFor, e2eFor time.Duration
	linger           time.Duration
	writeModes       string
	writeAsync       bool
	idleFor          time.Duration
	claimPending     int
	claimSamples     int
	claimHistory     []int

	consoleOutbox, consoleDead int
	consoleReuse               bool
	consoleSamples             int
	consoleBudget              time.Duration
	consoleReplay, consoleRate int

	logDBURL string
	logIdle  time.Duration
	bigTxn   int
	logParts string

	binlogDBURL, binlogParts string
	binlogWriters, binlogTxn int

	breakdownModes string
	breakdownRates []int

	eventsSet                bool // --events was given
	fleetParts               string
	fleetTenants, fleetSmall int
	fleetBaseline, fleetJoin int
	fleetDrainTenants        int
	fleetSettle              time.Duration
}

func main() {
	if spec := os.Getenv(fleetChildEnv); spec != "" { // a relay process of --scenario fleet
		os.Exit(runFleetChild(spec))
	}
	var c config
	flag.StringVar(&c.logDBURL, "log-db", env("OUTBOXKIT_TEST_PGLOGICAL_URL", "postgres://postgres@127.0.0.1:55432/test?sslmode=disable"),
		"Postgres with wal_level = logical for --scenario log (scripts/pg-logical.sh start)")
	flag.DurationVar(&c.logIdle, "log-idle", 10*time.Second, "how long --scenario log and --scenario binlog measure each relay idle")
	flag.StringVar(&c.binlogDBURL, "binlog-db", os.Getenv("OUTBOXKIT_TEST_MYSQLBINLOG_URL"),
		"MySQL or MariaDB with the binary log on (ROW, FULL images) for --scenario binlog (scripts/mariadb-binlog.sh start; default $OUTBOXKIT_TEST_MYSQLBINLOG_URL)")
	flag.StringVar(&c.binlogParts, "binlog-parts", "drain,latency", "what --scenario binlog measures, comma-separated: drain (the drain rate preloaded, "+
		"after a restart and streaming, beside the raw broker and the polling relay; the relay's statements per event and server CPU; its idle cost), "+
		"latency (COMMIT returned → publish confirmed at 1,000 msg/s, polling and binlog relay, and their statements per event)")
	flag.IntVar(&c.binlogWriters, "binlog-writers", 4, "writers at once in --scenario binlog's streaming drain")
	flag.IntVar(&c.binlogTxn, "binlog-txn", 100, "events a transaction of --scenario binlog's streaming writers")
	flag.StringVar(&c.logParts, "log-parts", "drain,e2e,write", "what --scenario log measures, comma-separated: drain (drain rate, WAL, "+
		"statements per event, idle cost, a big transaction's RSS), e2e (commit → consumer effect latency, and the highest rate), "+
		"write (the writers' cost in each mode), breakdown (where the e2e latency goes, stage by stage: not run by default), "+
		"floor (a Postgres COMMIT's and RabbitMQ's confirm and delivery latency at 1,000/s: not run by default)")
	flag.StringVar(&c.breakdownModes, "breakdown-modes", "wal", "the log relay's modes --log-parts breakdown times, comma-separated: wal, table")
	breakdownRates := flag.String("breakdown-rates", "1000,2000", "the offered rates, msg/s, --log-parts breakdown times each stage at")
	flag.IntVar(&c.bigTxn, "big-txn", 100000, "events of the one transaction whose relaying --scenario log measures the peak RSS of")
	flag.StringVar(&c.dbURL, "db", env("OUTBOXKIT_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL")
	flag.StringVar(&c.brokerURL, "broker", env("OUTBOXKIT_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&c.store, "store", "postgres", "the store of the drain and write scenarios: postgres (beside stock Watermill on Postgres), "+
		"mysql (beside stock Watermill on MySQL) or sqlite (to the memory broker and to RabbitMQ)")
	flag.StringVar(&c.mysqlURL, "mysql", env("OUTBOXKIT_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"), "MySQL or MariaDB URL, for --store mysql")
	flag.IntVar(&c.events, "events", 20000, "events preloaded for each drain (--scenario fleet: in all, 50000 unless given)")
	flag.IntVar(&c.keys, "keys", 200, "partition keys the events are spread over")
	flag.IntVar(&c.reps, "reps", 3, "repetitions of each measurement (the median is reported)")
	flag.StringVar(&c.jsonPath, "json", "bench-results/bench.json", "where to write the figures as JSON (empty: nowhere)")
	flag.StringVar(&c.comparePath, "compare", "", "an earlier run's JSON: print each figure beside its earlier median")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the outboxkit drains (drain), of the writers of the outbox row at 16 clients (write) "+
		"or of the first end-to-end run in WAL mode (log) to this file")
	flag.IntVar(&c.batch, "batch", 0, "forwarder BatchSize, also of the end-to-end relays (0: the default)")
	flag.IntVar(&c.inFlight, "inflight", 0, "forwarder MaxInFlight, also of the end-to-end relays (0: the default)")
	flag.IntVar(&c.relays, "relays", 1, "forwarders draining the outbox at once")
	flag.StringVar(&c.scenario, "scenario", "all", "what to measure: "+strings.Join(scenarioNames, ", ")+" or all")
	flag.DurationVar(&c.writeFor, "write-for", 5*time.Second, "length of each write-path measurement")
	flag.BoolVar(&c.writeAsync, "write-async", false, "run the Postgres write path with synchronous_commit off: "+
		"what a row costs in CPU, round trips and WAL without the commit's flush, whose wait is the same in every mode and the noisiest part of it")
	flag.StringVar(&c.writeModes, "write-modes", "", "the write-path modes to measure besides the business tx alone and the minimal row, comma-separated: "+
		"outbox, commit (the row sent with COMMIT), notify, relay, awake; empty: all")
	flag.DurationVar(&c.linger, "linger", 0, "the end-to-end runs' batch consumers' Linger (middleware.BatchConfig): how long a batch that is not full waits for more")
	flag.DurationVar(&c.e2eFor, "e2e-for", 20*time.Second, "length of each end-to-end run at a fixed rate")
	flag.DurationVar(&c.idleFor, "idle-for", 30*time.Second, "how long the idle scenario measures a pipeline without traffic")
	flag.IntVar(&c.claimPending, "claim-pending", 100, "pending rows one timed claim dispatches")
	flag.IntVar(&c.claimSamples, "claim-samples", 30, "timed claims per history size")
	history := flag.String("claim-history", "0,1000000,5000000", "published rows the outbox holds for each claim measurement")
	flag.StringVar(&c.backendURLs, "backends", defaultBackendURLs, "comma-separated broker URLs for --scenario backends")
	flag.IntVar(&c.consumerEvents, "consumer-events", 5000, "messages preloaded for each consumer measurement")
	flag.StringVar(&c.consumerKinds, "consumer-kinds", "", "the consumers --scenario consumer measures, comma-separated: "+
		"stock, plain, inbox-only, inbox (also over key shards), guarded, plain-batched, batched (also over key shards); empty: all")
	flag.IntVar(&c.consoleOutbox, "console-outbox", 10000000, "outbox rows the console scenario builds (3% dead letters, 4% pending)")
	flag.IntVar(&c.consoleDead, "console-dead", 1000000, "consumers' dead letters the console scenario builds")
	flag.BoolVar(&c.consoleReuse, "console-reuse", false, "keep the console scenario's tables when an earlier run built them at this size")
	flag.IntVar(&c.consoleSamples, "console-samples", 200, "requests timed per console page")
	flag.DurationVar(&c.consoleBudget, "console-budget", 300*time.Millisecond, "the p95 a console page must keep under (the run fails otherwise)")
	flag.IntVar(&c.consoleReplay, "console-replay", 100000, "outbox letters the console scenario replays under load (0: none)")
	flag.IntVar(&c.consoleRate, "console-rate", 2000, "the rate of that replay, letters a second")
	flag.StringVar(&c.fleetParts, "fleet-parts", "idle,join,drain", "what --scenario fleet measures, comma-separated: idle (a member's CPU, sessions, "+
		"transactions and memory over idle tenants, beside stock forwarders), join (tenant added to the catalog → its first event at the broker), "+
		"drain (many tenants' backlogs, a member beside a forwarder per tenant)")
	flag.IntVar(&c.fleetTenants, "fleet-tenants", 200, "schema tenants the fleet member of --scenario fleet relays idle")
	flag.IntVar(&c.fleetSmall, "fleet-small", 20, "tenants of the smaller idle member --scenario fleet measures too: memory per tenant is the slope between the two")
	flag.IntVar(&c.fleetBaseline, "fleet-baseline-tenants", 20, "stock forwarders (a pool and a LISTEN connection each) --scenario fleet measures idle beside the member")
	flag.IntVar(&c.fleetJoin, "fleet-join", 20, "tenants --scenario fleet adds to the running member one at a time, each round")
	flag.IntVar(&c.fleetDrainTenants, "fleet-drain-tenants", 50, "tenants --scenario fleet's drain spreads --events over")
	flag.DurationVar(&c.fleetSettle, "fleet-settle", 35*time.Second, "how long --scenario fleet leaves relays idle before measuring them (their polls back off to the longest interval)")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { c.eventsSet = c.eventsSet || f.Name == "events" })
	if c.scenario == "fleet" && !c.eventsSet {
		c.events = fleetEvents // so that the JSON says so too
	}
	for _, f := range strings.Split(*breakdownRates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: --breakdown-rates: %q is not a rate\n", f)
			os.Exit(2)
		}
		c.breakdownRates = append(c.breakdownRates, n)
	}
	for _, f := range strings.Split(*history, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "bench: --claim-history: %q is not a row count\n", f)
			os.Exit(2)
		}
		c.claimHistory = append(c.claimHistory, n)
	}
	if c.events < 1 || c.keys < 1 || c.reps < 1 {
		fmt.Fprintln(os.Stderr, "bench: --events, --keys and --reps must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // so each run drops what it made
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	fmt.Printf("outboxkit bench — %s, %d CPUs, %s\n", runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	var results []series
	ran := false
	for _, sc := range scenarios {
		if c.scenario != sc.name && (c.scenario != "all" || sc.name == "e2e-max" || sc.name == "console" || sc.name == "log" || sc.name == "binlog" || sc.name == "fleet" || sc.name == "kafka-txn") { // e2e runs the search too; console builds 10 M rows; log and binlog, a server of their own; fleet, a database
			continue
		}
		ran = true
		r, err := sc.run(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		results = append(results, r...)
	}
	if !ran {
		return fmt.Errorf("unknown --scenario %q: use %s or all", c.scenario, strings.Join(scenarioNames, ", "))
	}
	if c.comparePath != "" {
		out, err := compareWith(c.comparePath, results)
		if err != nil {
			return err
		}
		fmt.Print(out)
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

// scenarios run in this order under --scenario all.
var scenarios = []struct {
	name string
	run  func(context.Context, config) ([]series, error)
}{
	{"write", benchWritePath},
	{"drain", benchDrain},
	{"e2e", benchE2E},
	{"e2e-max", benchE2EMax},
	{"consumer", benchConsumer},
	{"scale", benchScale},
	{"claim", benchClaim},
	{"backends", benchBackends},
	{"idle", benchIdle},
	{"console", benchConsole},
	{"log", benchLog},
	{"binlog", benchBinlog},
	{"fleet", benchFleet},
	{"kafka-txn", benchKafkaTxn},
}

var scenarioNames = func() []string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return n
}()

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
