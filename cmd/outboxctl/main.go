// Command outboxctl operates an outboxkit database — Postgres, MySQL/MariaDB or SQLite:
// migrations, backlog status, dead letters on both sides (the outbox's and each consumer's), replay,
// pruning, the operator console in a browser, and a relay fleet: its status, and a member of it.
//
//	outboxctl [--db URL] [--schema NAME] COMMAND [flags]
//
// Exit codes: 0 ok, 1 the command failed, 2 the command line is wrong.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/outboxkit/outboxkit/store"
)

const usage = `outboxctl operates an outboxkit database.

Usage:
  outboxctl [--db URL] [--schema NAME] COMMAND [flags]

Commands:
  migrate                       create or upgrade the tables
  status [--json] [--broker URL --topic T]
                                outbox backlog and dead letters; per consumer: processed, duplicates, dead letters,
                                and with --broker its backlog in the broker (waiting, unacked, oldest); per log relay
                                group its slot (Postgres) or its checkpoint, reader and binary log lag (MySQL, MariaDB)
  outbox dead list [filters]    dead-lettered outbox rows
  outbox dead show SEQ          one dead-lettered outbox row, payload included
  outbox dead replay [filters]  put dead-lettered rows back in line (--dry-run lists them only)
  inbox dead list [filters]     messages dead-lettered by consumers
  inbox dead show ID            one dead-lettered message, payload included
  inbox dead replay [filters]   re-publish dead-lettered messages to their topics (needs --broker)
  prune                         delete outbox rows published past their retention, inbox rows past the dedup window
  console [--addr 127.0.0.1:8089] [--broker URL] [--prefix /console] [--basic-auth-file FILE] [--hide-payloads]
                                the operator console in a browser: what is stuck, failure groups, replay and archive
                                as jobs, pauses, audit. Sign-in tokens from OUTBOXKIT_CONSOLE_TOKENS
                                (name:role:secret,…); without any, it serves this machine only.
                                With --fleet NAME (--tenants FILE | --tenants-db URL --tenants-query SQL), the console
                                of a relay fleet whose coordination database is --db: its members and outboxes, those
                                without an owner first, and each tenant's console under /t/TENANT/
  fleet status --fleet NAME [--json] [--check]
                                a relay fleet from its coordination database (--db): the outboxes without an owner
                                first, each member's heartbeat, each outbox's owner, token and backlog; --check exits 1
                                naming the enabled outboxes with no owner or a stale one
  relay --fleet NAME --coordination URL --broker URL (--tenants FILE | --tenants-db URL --tenants-query SQL)
        [--addr :9090] [--lease-ttl 10s] [--member NAME]
                                one member of a relay fleet: relays the outboxes of the catalog it is given among the
                                fleet's live members, serves /metrics, /healthz and /readyz with --addr; SIGTERM or
                                SIGINT stops it, its leases released, exit 0
  relay --broker URL [--relay poll|log] [--name NAME] [--log-mode table|wal] [--addr :9090]
        [--transaction-interval 20ms]
                                the relay of the one outbox of --db, by polling or by reading the database's log
                                (Postgres's write-ahead log, the binary log of MySQL or MariaDB); settings also from
                                the environment (OUTBOXKIT_DATABASE_URL, OUTBOXKIT_BROKER_URL,
                                OUTBOXKIT_RELAY, OUTBOXKIT_RELAY_NAME, OUTBOXKIT_LOG_MODE: a systemd EnvironmentFile or
                                docker --env-file); SIGTERM publishes and marks what it holds, exit 0; a relay a
                                newer one of its Kafka relay group fenced exits 1

Global flags:
  --db URL        database URL (env OUTBOXKIT_DATABASE_URL): postgres://user@host:5432/db,
                  mysql://user:pass@host:3306/db or sqlite://path/to/file.db
  --schema NAME   Postgres schema or MySQL database holding the tables
                  (env OUTBOXKIT_SCHEMA, default outboxkit; SQLite keeps them in its file)

Run "outboxctl COMMAND --help" for a command's flags.
`

// usageError is a mistake on the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "outboxctl: %s\nRun \"outboxctl --help\" for usage.\n", ue.msg)
		return 2
	default:
		fmt.Fprintf(stderr, "outboxctl: %s\n", err)
		if errors.Is(err, store.ErrNotMigrated) {
			fmt.Fprintln(stderr, "The tables are missing: run \"outboxctl migrate\" (with the same --db and --schema) first.")
		}
		return 1
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	global := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	dbURL := global.String("db", os.Getenv("OUTBOXKIT_DATABASE_URL"), "")
	schemaName := global.String("schema", envOr("OUTBOXKIT_SCHEMA", "outboxkit"), "")
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return err
		}
		return usagef("%v", err)
	}
	rest := global.Args()
	if len(rest) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command given")
	}
	env := &env{dbURL: *dbURL, schema: *schemaName, stdout: stdout}
	cmd, sub := rest[0], rest[1:]
	switch cmd {
	case "migrate":
		return env.migrate(ctx, sub)
	case "status":
		return env.status(ctx, sub)
	case "prune":
		return env.prune(ctx, sub)
	case "console":
		return env.consoleCmd(ctx, sub)
	case "fleet":
		return env.fleetCmd(ctx, sub)
	case "relay":
		return env.relayCmd(ctx, sub)
	case "outbox", "inbox":
		if len(sub) < 2 || sub[0] != "dead" {
			return usagef("%s takes: dead list|show|replay", cmd)
		}
		switch sub[1] {
		case "list":
			return env.deadList(ctx, cmd, sub[2:])
		case "show":
			return env.deadShow(ctx, cmd, sub[2:])
		case "replay":
			return env.deadReplay(ctx, cmd, sub[2:])
		}
		return usagef("unknown command %q: %s dead takes list, show or replay", strings.Join(sub[:2], " "), cmd)
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return usagef("unknown command %q", cmd)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
