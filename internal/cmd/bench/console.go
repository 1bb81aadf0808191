package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/outboxkit/outboxkit/store"
)

// consoleBenchSchema holds the console scenario's data (on MySQL it is a database): always the
// same, so that --console-reuse finds what an earlier run built.
const consoleBenchSchema = "outboxkit_console_bench"

// benchConsole builds an outbox of --console-outbox rows (4% pending, 3% dead letters) and
// --console-dead consumers' dead letters (60 failure groups, 3 consumers, 200,000 keys, 30 days),
// then serves a real console.Handler over it and times every kind of page; then, unless
// --console-replay is 0, replays that many outbox letters at --console-rate while a writer and a
// relay run, and reports the job's rate and the live rows' latency before and during.
func benchConsole(ctx context.Context, c config) ([]series, error) {
	db, cleanup, err := openConsoleBench(ctx, c)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	fmt.Printf("\nconsole: %s, %d outbox rows, %d consumers' dead letters, %d samples a page, budget p95 %s\n",
		db.Info().Name, c.consoleOutbox, c.consoleDead, c.consoleSamples, c.consoleBudget)
	if err := buildConsoleBench(ctx, c, db); err != nil {
		return nil, err
	}
	rows, slow, err := timeConsolePages(ctx, c, db)
	if err != nil {
		return nil, err
	}
	if c.consoleReplay > 0 {
		r, err := benchConsoleReplay(ctx, c, db)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if len(slow) > 0 {
		return rows, fmt.Errorf("pages over the %s p95 budget: %s", c.consoleBudget, strings.Join(slow, ", "))
	}
	return rows, nil
}

func openConsoleBench(ctx context.Context, c config) (*store.DB, func(), error) {
	var dbURL string
	switch c.store {
	case "postgres":
		dbURL = c.dbURL
	case "mysql":
		dbURL = c.mysqlURL
	case "sqlite":
		if err := os.MkdirAll(".cache", 0o755); err != nil {
			return nil, nil, err
		}
		dbURL = "sqlite://" + filepath.Join(".cache", "console-bench.db")
	default:
		return nil, nil, fmt.Errorf("--store %q: use postgres, mysql or sqlite", c.store)
	}
	db, err := store.Open(ctx, dbURL, store.OpenOptions{Schema: consoleBenchSchema, MaxConns: 8, PollOnly: true})
	if err != nil {
		return nil, nil, err
	}
	return db, func() { _ = db.Close() }, nil
}
