// Command chaos is outboxkit's soak: the demo's order service, two or more forwarders and the
// Shipping, Billing and Search consumers run as separate processes against real services; orders
// are offered at a steady rate (some POSTs repeated with the same Idempotency-Key, every
// unanswered one retried as a client would) while faults are injected at random, all at once:
// processes killed with SIGKILL and restarted, the soak's broker connections closed (and, with
// --broker-restart, the broker application stopped and started), the soak's own database sessions
// terminated, poisoned events, relays dying between publish and mark, Billing dying between its
// charge and its commit. After a bounded drain an invariant checker reads the databases and the
// run prints its failure matrix; it exits 1 on any violation.
//
//	go run ./internal/cmd/chaos [--store postgres|mysql|sqlite] [--broker amqp|kafka|nats|redis] [--duration 2m] [--rate 20]
//
// Everything it creates is its own and is removed at the end (--keep keeps it): a Postgres schema
// or MySQL database (and a MySQL user) or SQLite files, a RabbitMQ vhost, NATS stream or Redis
// stream, a Kafka broker (kfake) of its own. It touches nothing else on the shared servers, except
// that --broker-restart stops the whole RabbitMQ application for a few seconds.
//
// --no-inbox is the negative control: the consumers run without their inbox, and the checker
// must report the redeliveries they applied twice.
//
// With --broker kafka the checker also reads the soak's topic from its start as a consumer without
// an inbox would, at read_committed, and holds it against the outbox: every published event there,
// in each key's order. The relays' crashes (SIGKILL, --crash-after-publish) publish again what a
// relay published and did not mark: that reader sees those duplicates, reported as information.
// --kafka-txn makes them impossible: the relay processes publish in Kafka transactions
// (transactional_id=<the run's name>), each pass one transaction with the relay's progress, and
// the reader must see every event exactly once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type options struct {
	store, broker       string
	dbURL, brokerURL    string
	duration, drain     time.Duration
	rate                float64
	relays              int
	relaysGiven         bool // --relays on the command line
	relay, relayMode    string
	unacked, replicas   int
	faultEvery          time.Duration
	retryPercent        int
	cancelPercent       int
	poisonPercent       int
	crashAfterPublish   int
	crashAfterCharge    int
	brokerRestart       bool
	noInbox             bool
	kafkaTxn            bool
	keep                bool
	demoBin, repo, work string
	seed                uint64
	quiet               bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == txnRelayCommand { // one of the soak's processes (txnrelay.go)
		os.Exit(txnRelayMain(os.Args[2:]))
	}
	var o options
	flag.StringVar(&o.store, "store", "postgres", "the database: postgres, mysql or sqlite")
	flag.StringVar(&o.broker, "broker", "amqp", "the broker: amqp, kafka, nats or redis")
	flag.StringVar(&o.dbURL, "db", "", "the database server (default: $OUTBOXKIT_TEST_POSTGRES_URL or $OUTBOXKIT_TEST_MYSQL_URL, else the local one; "+
		"with --relay log, $OUTBOXKIT_TEST_PGLOGICAL_URL or $OUTBOXKIT_TEST_MYSQLBINLOG_URL); the soak creates a schema (MySQL: a database and a user) "+
		"of its own in it")
	flag.StringVar(&o.brokerURL, "broker-url", "", "the broker server (default: $OUTBOXKIT_TEST_AMQP_URL, …_NATS_URL, …_REDIS_URL, else the local one); "+
		"kafka: a broker (kfake) of the soak's own is started")
	flag.DurationVar(&o.duration, "duration", 2*time.Minute, "how long orders are offered and faults injected")
	flag.DurationVar(&o.drain, "drain", 3*time.Minute, "how long the system may take to settle once the faults stop")
	flag.Float64Var(&o.rate, "rate", 20, "orders offered per second")
	flag.IntVar(&o.relays, "relays", 2, "forwarder processes (with --kafka-txn, 1 unless given: the relays of one transactional id "+
		"fence each other at every start, so two of them take turns, each exiting fenced as the other restarts — a soak of the fencing)")
	flag.StringVar(&o.relay, "relay", "poll", "the relay the forwarder processes run: poll (the polling forwarder) or log: with --store postgres "+
		"forwarder/pglog, reading a logical replication slot on a server with wal_level = logical (default --db $OUTBOXKIT_TEST_PGLOGICAL_URL, "+
		"see scripts/pg-logical.sh); with --store mysql forwarder/mysqlbinlog, reading the binary log of a MariaDB or MySQL server that keeps it "+
		"in ROW format with FULL images (default --db $OUTBOXKIT_TEST_MYSQLBINLOG_URL, see scripts/mariadb-binlog.sh). One log relay reads, "+
		"the others stand by")
	flag.StringVar(&o.relayMode, "relay-mode", "table", "with --relay log: table (events are outbox rows, removed once published) or wal "+
		"(logical decoding messages, no row; Postgres only)")
	flag.IntVar(&o.replicas, "replicas", 2, "processes per consumer, in its group, as a service that must not stop when one of its processes "+
		"dies would run (Kafka: the soak's broker gives the topic 4 partitions to share); with 1, Billing, made to exit every "+
		"--crash-after-charge charges, is down for each restart and falls behind the orders")
	flag.IntVar(&o.unacked, "unacked", 1, "messages each consumer process handles at once (the demo's --unacked)")
	flag.DurationVar(&o.faultEvery, "fault-every", 2*time.Second, "mean time between injected faults")
	flag.IntVar(&o.retryPercent, "retry-percent", 10, "share of POSTs sent again with the same Idempotency-Key (half at once, half after the answer)")
	flag.IntVar(&o.cancelPercent, "cancel-percent", 10, "share of orders cancelled once placed (their OrderCancelled must follow their OrderPlaced)")
	flag.IntVar(&o.poisonPercent, "poison-percent", 2, "share of orders whose event no consumer can decode (each consumer must dead-letter it)")
	flag.IntVar(&o.crashAfterPublish, "crash-after-publish", 25, "every Nth relay pass dies after publishing, before marking (0: never); "+
		"with --relay log, which has no passes, a relay process exits after publishing, before confirming, at every Nth flush "+
		"that removes published rows (about one a second)")
	flag.IntVar(&o.crashAfterCharge, "crash-after-charge", 40, "Billing's process exits after every Nth charge, before its invoice commits (0: never; "+
		"on Kafka too: its consumers are static members of their groups, so a restart costs no rebalance)")
	flag.BoolVar(&o.brokerRestart, "broker-restart", false, "amqp: also stop and start the RabbitMQ application (every client of the shared broker sees it)")
	flag.BoolVar(&o.noInbox, "no-inbox", false, "negative control: run the consumers without their inbox; the checker must fail")
	flag.BoolVar(&o.kafkaTxn, "kafka-txn", false, "with --broker kafka: the relay processes publish in Kafka transactions, one relay group "+
		"(transactional_id) of the run's own, and die at every --crash-after-publish-th pass with the transaction open or after the commit; "+
		"the checker's read_committed reader, without an inbox, must see each event once, in each key's order")
	flag.BoolVar(&o.keep, "keep", false, "keep the schema, vhost, streams and logs for inspection")
	flag.StringVar(&o.demoBin, "demo", "", "a built cmd/demo binary (default: built from --repo)")
	flag.StringVar(&o.repo, "repo", ".", "the outboxkit repository (to build cmd/demo and tools/kfake)")
	flag.StringVar(&o.work, "work", "", "directory for the processes' logs and SQLite files (default: a new temporary one)")
	flag.Uint64Var(&o.seed, "seed", 0, "random seed for the faults and the load (0: from the clock); printed, to replay a run")
	flag.BoolVar(&o.quiet, "quiet", false, "print the result only, not each fault")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "relays" {
			o.relaysGiven = true
		}
	})
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func (o *options) validate() error {
	var errs []string
	switch o.store {
	case "postgres", "mysql", "sqlite":
	default:
		errs = append(errs, fmt.Sprintf("--store %q: use postgres, mysql or sqlite", o.store))
	}
	switch o.broker {
	case "amqp", "kafka", "nats", "redis":
	default:
		errs = append(errs, fmt.Sprintf("--broker %q: use amqp, kafka, nats or redis", o.broker))
	}
	if o.duration <= 0 || o.drain <= 0 || o.rate <= 0 || o.faultEvery <= 0 {
		errs = append(errs, "--duration, --drain, --rate and --fault-every must be positive")
	}
	if o.relays < 1 {
		errs = append(errs, "--relays must be at least 1")
	}
	if o.unacked < 1 || o.replicas < 1 {
		errs = append(errs, "--unacked and --replicas must be at least 1")
	}
	for _, p := range []int{o.retryPercent, o.cancelPercent, o.poisonPercent} {
		if p < 0 || p > 100 {
			errs = append(errs, "the --*-percent flags take 0..100")
			break
		}
	}
	if o.crashAfterPublish < 0 || o.crashAfterCharge < 0 {
		errs = append(errs, "--crash-after-publish and --crash-after-charge take N ≥ 0")
	}
	switch o.relay {
	case "poll":
		if o.relayMode != "table" {
			errs = append(errs, "--relay-mode goes with --relay log")
		}
	case "log":
		switch o.store {
		case "postgres":
			if o.relayMode != "table" && o.relayMode != "wal" {
				errs = append(errs, fmt.Sprintf("--relay-mode %q: use table or wal", o.relayMode))
			}
			if o.dbURL == "" {
				if o.dbURL = os.Getenv("OUTBOXKIT_TEST_PGLOGICAL_URL"); o.dbURL == "" {
					errs = append(errs, "--relay log needs a Postgres server with wal_level = logical: start the private one with "+
						"`scripts/pg-logical.sh start` and pass --db \"$(scripts/pg-logical.sh url)\" (or set OUTBOXKIT_TEST_PGLOGICAL_URL)")
				}
			}
		case "mysql":
			if o.relayMode != "table" {
				errs = append(errs, fmt.Sprintf("--relay-mode %q: the binlog relay reads outbox rows from the binary log (--relay-mode table); "+
					"wal is Postgres's", o.relayMode))
			}
			if o.dbURL == "" {
				if o.dbURL = os.Getenv("OUTBOXKIT_TEST_MYSQLBINLOG_URL"); o.dbURL == "" {
					errs = append(errs, "--relay log with --store mysql needs a MariaDB or MySQL server with the binary log on (ROW format, "+
						"FULL images): start the private one with `scripts/mariadb-binlog.sh start` and pass --db \"$(scripts/mariadb-binlog.sh url)\" "+
						"(or set OUTBOXKIT_TEST_MYSQLBINLOG_URL)")
				}
			}
		default:
			errs = append(errs, fmt.Sprintf("--relay log reads the database's log (Postgres's write-ahead log, the binary log of MySQL): "+
				"it goes with --store postgres or mysql, not %s (--relay poll works on every store)", o.store))
		}
	default:
		errs = append(errs, fmt.Sprintf("--relay %q: use poll or log", o.relay))
	}
	if o.kafkaTxn {
		if o.broker != "kafka" {
			errs = append(errs, fmt.Sprintf("--kafka-txn makes the relays publish in Kafka transactions: it goes with --broker kafka, not %s", o.broker))
		}
		if o.relay != "poll" {
			errs = append(errs, "--kafka-txn runs the soak's transactional polling relay: it does not go with --relay log")
		}
		if !o.relaysGiven {
			// One relay group, one relay: killed and restarted, it fences only its dead self. Two
			// would fence each other at every start.
			o.relays = 1
		}
	}
	if o.brokerRestart && o.broker != "amqp" {
		errs = append(errs, "--broker-restart restarts RabbitMQ: it goes with --broker amqp")
	}
	if o.dbURL == "" {
		switch o.store {
		case "postgres":
			o.dbURL = envOr("OUTBOXKIT_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		case "mysql":
			o.dbURL = envOr("OUTBOXKIT_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
		}
	}
	if o.brokerURL == "" {
		switch o.broker {
		case "amqp":
			o.brokerURL = envOr("OUTBOXKIT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
		case "nats":
			o.brokerURL = envOr("OUTBOXKIT_TEST_NATS_URL", "nats://127.0.0.1:4222")
		case "redis":
			o.brokerURL = envOr("OUTBOXKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// brokerLabel names the broker and the relay as the run's first line and its matrix print them.
func (o *options) brokerLabel() string {
	switch {
	case o.relay == "log" && o.store == "mysql":
		return o.broker + ", binlog relay"
	case o.relay == "log":
		return o.broker + ", log relay (" + o.relayMode + " mode)"
	case o.kafkaTxn:
		return o.broker + ", transactional relay"
	}
	return o.broker
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
