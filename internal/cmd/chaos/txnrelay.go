package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/store"
)

// txnRelayCommand runs this binary as one of the soak's relay processes in --kafka-txn mode
// (`chaos txn-relay …`): a forwarder whose publisher is the Kafka backend's transactional one.
// The demo's relay role cannot be that process: it wraps the broker's publisher in its fault
// injector, which hides forwarder.TransactionalPublisher from the forwarder (its passes would not
// be transactions), and it goes on serving once its relay's Run has returned fenced.
const txnRelayCommand = "txn-relay"

// exitFenced is the status a transactional relay process exits with when another relay of its
// group fenced it: the supervisor restarts it as it restarts a killed one, and counts it.
const exitFenced = 4

// The lines a transactional relay process prints, which the soak counts.
const (
	txnFaultOpen      = "txn-relay: fault: killed with its transaction open"
	txnFaultCommitted = "txn-relay: fault: killed after its commit, before its mark"
	txnFenced         = "txn-relay: fenced"
	// The forwarder's info line when it marked the rows a dead relay's last transaction committed.
	txnRecovered = "group's last transaction committed"
)

// txnRelayMain is `chaos txn-relay`: it returns the process's exit status.
func txnRelayMain(args []string) int {
	fs := flag.NewFlagSet("chaos "+txnRelayCommand, flag.ContinueOnError)
	dbURL := fs.String("db", "", "the soak's database URL")
	schema := fs.String("schema", "", "the soak's schema")
	brokerURL := fs.String("broker", "", "a kafka:// URL with transactional_id=<relay group>")
	name := fs.String("name", "relay", "the forwarder's name")
	crashEvery := fs.Int64("crash-after-publish", 0, "every Nth pass the process kills itself with SIGKILL, at random with its transaction "+
		"open (after publishing, before committing) or after the commit, before the mark (0: never)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runTxnRelay(*dbURL, *schema, *brokerURL, *name, *crashEvery); err != nil {
		if outboxkit.IsFenced(err) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", txnFenced, err)
			return exitFenced
		}
		fmt.Fprintf(os.Stderr, "txn-relay: %v\n", err)
		return 1
	}
	return 0
}

func runTxnRelay(dbURL, schema, brokerURL, name string, crashEvery int64) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	db, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: schema})
	if err != nil {
		return err
	}
	defer db.Close()
	broker, err := backends.Open(ctx, brokerURL, backends.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer broker.Close()
	if _, ok := broker.Publisher.(forwarder.TransactionalPublisher); !ok {
		return fmt.Errorf("the broker URL %s makes no transactional publisher: give it transactional_id=<relay group>", brokerURL)
	}
	relay, err := forwarder.New(forwarder.Config{
		Store: db, Name: name, Publisher: broker.Publisher, Logger: logger,
		// The demo's relay's, so that both modes of the soak relay alike.
		Backoff: forwarder.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2},
	})
	if err != nil {
		return err
	}
	if crashEvery > 0 {
		injectTxnCrashes(relay, crashEvery)
	}
	return relay.Run(ctx) // nil once SIGTERM ends it
}

// injectTxnCrashes makes every crashEvery-th pass that claimed rows kill the process, at the two
// points a transaction must make harmless: with the transaction open (the successor's start aborts
// it: none of its records is ever read) and after the commit, before the mark (the successor marks
// the rows from the progress the transaction carried instead of publishing them again). Without
// transactions either is a duplicate for a consumer without an inbox. (Every Nth pass, as the
// demo's --crash-after-publish: a backlog longer than N messages would otherwise kill every pass.)
// The point is drawn at random: the count starts again in each process, so a process never
// reaches a second multiple of N.
func injectTxnCrashes(relay *forwarder.Forwarder, every int64) {
	var passes atomic.Int64
	var afterCommit atomic.Bool // the pass that must die after its commit
	die := func(line string, pass int64) error {
		fmt.Fprintf(os.Stderr, "%s (pass %d, --crash-after-publish %d)\n", line, pass, every)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	faults.Inject(relay, faults.AfterPublish, func() error {
		n := passes.Add(1)
		if n%every != 0 {
			return nil
		}
		if rand.IntN(2) == 0 {
			return die(txnFaultOpen, n)
		}
		afterCommit.Store(true) // dies in this pass's commit hook, or the next pass that commits
		return nil
	})
	faults.Inject(relay, faults.AfterCommit, func() error {
		if afterCommit.Load() {
			return die(txnFaultCommitted, passes.Load())
		}
		return nil
	})
}
