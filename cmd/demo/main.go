// Command demo runs an order service and its consumers in one process: POST /orders writes an
// order and its OrderPlaced event in one transaction; the forwarder relays the event to the broker;
// Shipping, Billing and Search each handle it once, behind their own inbox. It places a stream of
// sample orders and prints a status line every second.
//
//	go run ./cmd/demo [--orders 200] [--rate 50] [--serve] [fault switches]
//
// By default it needs no server: the database is a SQLite file (.cache/outboxkit-demo.db) and the
// broker is in-process (memory://). --db and --broker point it at Postgres, MySQL, RabbitMQ, Kafka,
// NATS or Redis instead. See the README for the fault switches and what each one shows.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/urls"
)

type options struct {
	dbURL, brokerURL, schema, addr string

	// role is what this process runs: all of it, or one part, so that the parts can run (and
	// be killed) as separate processes: orders (the HTTP service and the payment gateway), relay
	// (a forwarder; run several), consumers (those named in only).
	role      string
	only      []string // consumers to run; all when empty
	relayName string
	// relay is the kind of relay a relay process runs: poll (forwarder.Run, every store) or log
	// (forwarder/pglog on Postgres with wal_level = logical, in relayMode table or wal;
	// forwarder/mysqlbinlog on MySQL or MariaDB with the binary log, in relayMode table).
	relay, relayMode, relayGroup string
	// kafkaInstanceID makes this process's Kafka subscriptions static members of their groups
	// (backends.Options.KafkaInstanceID), so that its restart does not rebalance them.
	kafkaInstanceID string
	// unacked is how many messages each consumer's subscription hands out before the first is
	// acknowledged (backends.Options.Unacked): the router runs that many handlers at once.
	unacked    int
	gatewayURL string // the payment gateway Billing charges; default this process's own

	orders        int
	rate          float64
	retryPercent  int
	serve         bool
	statusEvery   time.Duration
	readyMaxAge   time.Duration
	drainDeadline time.Duration
	verbose       bool
	logLevel      string // the library's log lines from this level up, on stderr; "" for none

	failPublishEvery  int64
	crashAfterPublish int64
	poisonEvery       int64
	poisonCustomer    string
	consumerCrash     int64
	crashAfterCharge  int64
	rejectCustomer    string
	noInbox           bool

	// console mounts the operator console at /console (OUTBOXKIT_CONSOLE_TOKENS signs people in;
	// without tokens it serves this machine only).
	console bool
}

// defaultDB and defaultBroker need no server.
const (
	defaultDB     = "sqlite://.cache/outboxkit-demo.db"
	defaultBroker = "memory://"
)

func main() {
	var o options
	flag.StringVar(&o.dbURL, "db", env("OUTBOXKIT_DATABASE_URL", defaultDB),
		"database URL: sqlite://file, postgres://… or mysql://… (env OUTBOXKIT_DATABASE_URL)")
	flag.StringVar(&o.brokerURL, "broker", env("OUTBOXKIT_BROKER_URL", defaultBroker),
		"broker URL: memory://, amqp://, kafka://, nats://, redis:// (env OUTBOXKIT_BROKER_URL)")
	flag.StringVar(&o.schema, "schema", env("OUTBOXKIT_SCHEMA", "outboxkit_demo"),
		"Postgres schema or MySQL database for the demo's tables and outboxkit's (SQLite: the file holds them); it names the broker topic too")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "HTTP listen address")
	flag.StringVar(&o.role, "role", roleAll, "what this process runs: all, or one part to run as a process of its own: "+
		"orders (the HTTP service and the payment gateway), relay (a forwarder: run several) or consumers")
	consumers := flag.String("consumers", "", "with --role consumers: the consumers to run, comma-separated (default: shipping,billing,search)")
	flag.StringVar(&o.relayName, "relay-name", "demo", "the forwarder's name in metrics and logs (give each relay process its own)")
	flag.StringVar(&o.relay, "relay", relayPoll, "the relay: poll (the polling forwarder, every store) or log, which reads the outbox from the "+
		"database's log: on Postgres forwarder/pglog, from a logical replication slot (wal_level = logical, a REPLICATION role, no pooler); on "+
		"MySQL or MariaDB forwarder/mysqlbinlog, from the binary log (binlog_format = ROW, binlog_row_image = FULL, a user with REPLICATION SLAVE "+
		"and BINLOG MONITOR — REPLICATION CLIENT on MySQL)")
	flag.StringVar(&o.relayMode, "relay-mode", string(pglog.ModeTable), "with --relay log, how writers hand it their events: table (outbox rows, "+
		"which it removes once published) or wal (Postgres 14+ only: logical decoding messages, no row). Give every process of the demo the same mode")
	flag.StringVar(&o.relayGroup, "relay-group", "demo", "with --relay log, the relay group: it names the replication slot (Postgres) or the "+
		"checkpoint and the lock (MySQL), which one relay process of the group holds at a time while the others stand by")
	flag.StringVar(&o.kafkaInstanceID, "kafka-instance-id", "", "kafka: this process's static member name in its consumer groups, stable across "+
		"its restarts and unique among the group's processes (\"billing-0\"): a restart within the session timeout does not rebalance the group")
	flag.IntVar(&o.unacked, "unacked", 1, "how many messages each consumer handles at once (its subscription hands out that many before the first is "+
		"acknowledged): more than 1 overlaps their waits — Billing's call to the payment gateway, each commit — and the order guard keeps each "+
		"order's events in order")
	flag.StringVar(&o.gatewayURL, "gateway", "", "the payment gateway Billing charges (default: this process's own /gateway/charges; "+
		"with --role consumers, the orders process's)")
	flag.IntVar(&o.orders, "orders", 200, "sample orders to place (0: none, with --serve)")
	flag.Float64Var(&o.rate, "rate", 50, "sample orders per second")
	flag.IntVar(&o.retryPercent, "retry-percent", 10, "share of sample POSTs sent again with the same Idempotency-Key")
	flag.BoolVar(&o.serve, "serve", false, "keep serving after the sample orders, until interrupted")
	flag.DurationVar(&o.statusEvery, "status-every", time.Second, "how often to print the status line (0: never)")
	flag.DurationVar(&o.readyMaxAge, "ready-max-pending-age", 30*time.Second, "/readyz fails when the oldest pending event is older")
	flag.DurationVar(&o.drainDeadline, "drain-deadline", 60*time.Second, "how long to wait for every consumer once the samples are placed")
	flag.BoolVar(&o.verbose, "verbose", false, "log the library's debug lines")
	flag.StringVar(&o.logLevel, "log-level", "", "log the library's lines from this level up on stderr: error, warn, info or debug (default: none; --verbose: debug)")
	flag.Int64Var(&o.failPublishEvery, "fail-publish-every", 0, "refuse every Nth publish: the forwarder backs off and retries it")
	flag.Int64Var(&o.crashAfterPublish, "crash-after-publish", 0, "make every Nth relay pass die after publishing, before marking: "+
		"the rows are published again and every inbox absorbs the duplicates; with --relay log, which has no passes, the process exits "+
		"after publishing, before the relay confirms what it published, at every Nth flush that removes published rows "+
		"(the slot's confirmation on Postgres, the checkpoint on MySQL), and the group's standby takes over and publishes it again")
	flag.Int64Var(&o.poisonEvery, "poison-every", 0, "give every Nth order's event a payload no consumer can decode: each consumer dead-letters it")
	flag.StringVar(&o.poisonCustomer, "poison-customer", "", "give the events of this customer's orders a payload no consumer can decode: each consumer dead-letters them")
	flag.Int64Var(&o.consumerCrash, "consumer-crash-every", 0, "make Billing fail before commit on every Nth message: it is rolled back and redelivered")
	flag.Int64Var(&o.crashAfterCharge, "crash-after-charge-every", 0, "make the process exit (status 3) after Billing's Nth charge at the payment "+
		"gateway, before its invoice commits: restarted, Billing charges again with the same Idempotency-Key and the gateway charges once (needs a durable broker)")
	flag.StringVar(&o.rejectCustomer, "reject-customer", "", "make Billing refuse orders of this customer as permanently invalid: "+
		"they are dead-lettered; restart without it and replay them with outboxctl")
	flag.BoolVar(&o.console, "console", true, "mount the operator console at /console (sign-in tokens from OUTBOXKIT_CONSOLE_TOKENS; without any, this machine only)")
	flag.BoolVar(&o.noInbox, "no-inbox", false, "run the consumers WITHOUT their inbox (and order guard), to show what it prevents: "+
		"redelivered events are applied again, and the effects table shows it")
	flag.Parse()
	if *consumers != "" {
		o.only = strings.Split(*consumers, ",")
	}
	if o.role == roleRelay || o.role == roleConsumers {
		// A part with no service of its own places no sample orders: it serves until stopped.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["orders"] {
			o.orders = 0
		}
		if !set["serve"] {
			o.serve = true
		}
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func (o options) validate() error {
	var errs []string
	if o.orders < 0 || o.rate <= 0 || o.retryPercent < 0 || o.retryPercent > 100 {
		errs = append(errs, "--orders must be ≥ 0, --rate > 0, --retry-percent within 0..100")
	}
	switch o.role {
	case roleAll, roleOrders, roleRelay, roleConsumers:
	default:
		errs = append(errs, fmt.Sprintf("--role %q: use all, orders, relay or consumers", o.role))
	}
	for _, c := range o.only {
		if !slices.ContainsFunc(consumerNames, func(s consumerSpec) bool { return s.name == c }) {
			errs = append(errs, fmt.Sprintf("--consumers: no consumer %q (there are shipping, billing and search)", c))
		}
	}
	if len(o.only) > 0 && o.role != roleConsumers {
		errs = append(errs, "--consumers goes with --role consumers")
	}
	if o.role == roleConsumers && o.gatewayURL == "" && (len(o.only) == 0 || slices.Contains(o.only, "billing")) {
		errs = append(errs, "--role consumers runs Billing, which charges the payment gateway of the orders process: pass --gateway http://…/gateway/charges")
	}
	if o.orders > 0 && (o.role == roleRelay || o.role == roleConsumers) {
		errs = append(errs, "--orders places sample orders through this process's own service: pass --orders 0 --serve with --role "+o.role)
	}
	if o.orders == 0 && !o.serve {
		errs = append(errs, "--orders 0 places nothing: add --serve to run the service only")
	}
	if o.crashAfterCharge > 0 && strings.HasPrefix(o.brokerURL, "memory:") {
		errs = append(errs, "--crash-after-charge-every exits the process, and the memory broker's messages die with it: "+
			"pass a durable --broker (amqp://, kafka://, nats://, redis://, postgres://)")
	}
	switch o.relay {
	case relayPoll:
		if o.relayMode != string(pglog.ModeTable) {
			errs = append(errs, "--relay-mode goes with --relay log (the polling relay reads outbox rows)")
		}
	case relayLog:
		switch o.dialect() {
		case "postgres":
			if o.relayMode != string(pglog.ModeTable) && o.relayMode != string(pglog.ModeWAL) {
				errs = append(errs, fmt.Sprintf("--relay-mode %q: use table or wal", o.relayMode))
			}
		case "mysql":
			if o.relayMode != string(pglog.ModeTable) {
				errs = append(errs, fmt.Sprintf("--relay-mode %q: the binlog relay (MySQL, MariaDB) reads outbox rows from the binary log; "+
					"--relay-mode wal is Postgres's (logical decoding messages): use --relay-mode table, or a postgres:// --db", o.relayMode))
			}
		default:
			errs = append(errs, "--relay log reads the database's log — Postgres's write-ahead log (wal_level = logical) or the binary log of "+
				"MySQL or MariaDB (binlog_format = ROW): pass a postgres:// or mysql:// --db whose server keeps it, or use --relay poll, "+
				"which works on every database")
		}
	default:
		errs = append(errs, fmt.Sprintf("--relay %q: use poll or log", o.relay))
	}
	if _, ok := logLevels[o.logLevel]; !ok && o.logLevel != "" {
		errs = append(errs, fmt.Sprintf("--log-level %q: one of error, warn, info, debug", o.logLevel))
	}
	if o.unacked < 1 {
		errs = append(errs, fmt.Sprintf("--unacked %d: a consumer handles at least 1 message at a time", o.unacked))
	}
	if o.failPublishEvery < 0 || o.crashAfterPublish < 0 || o.poisonEvery < 0 || o.consumerCrash < 0 || o.crashAfterCharge < 0 {
		errs = append(errs, "fault switches take a positive N (every Nth), or 0 for off")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

const (
	relayPoll = "poll"
	relayLog  = "log"
)

const (
	roleAll       = "all"
	roleOrders    = "orders"
	roleRelay     = "relay"
	roleConsumers = "consumers"
)

// dialect is the database --db names: postgres, mysql, or "" for another (SQLite).
func (o options) dialect() string { return urls.Dialect(o.dbURL) }

// runs reports whether this process runs part.
func (o options) runs(part string) bool { return o.role == roleAll || o.role == part }

// runsConsumer reports whether this process runs the consumer name.
func (o options) runsConsumer(name string) bool {
	return o.runs(roleConsumers) && (len(o.only) == 0 || slices.Contains(o.only, name))
}

// logLevels are the levels --log-level names.
var logLevels = map[string]slog.Level{"error": slog.LevelError, "warn": slog.LevelWarn, "info": slog.LevelInfo, "debug": slog.LevelDebug}
