package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/allbackends" // every broker URL
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/mysqlbinlog"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/allstores" // every database URL
)

type env struct {
	dbURL  string
	schema string
	stdout io.Writer
}

// connect opens the store --db names, which must exist unless the command creates it (migrate). It
// opens no LISTEN connection: outboxctl relays nothing.
func (e *env) connect(ctx context.Context, create bool) (*store.DB, error) {
	if e.dbURL == "" {
		return nil, usagef("no database: pass --db URL (%s) or set OUTBOXKIT_DATABASE_URL", store.Schemes())
	}
	if !strings.Contains(e.dbURL, "://") {
		return nil, usagef("--db %q is not a database URL: use one of %s", e.dbURL, store.Schemes())
	}
	opts := store.OpenOptions{Schema: e.schema, PollOnly: true}
	if strings.HasPrefix(strings.ToLower(e.dbURL), "sqlite://") {
		// Reading a file that is not there would create an empty database and report nothing wrong.
		opts.MustExist = !create
	}
	return store.Open(ctx, e.dbURL, opts)
}

// flags is a command's flag set, with the global --db and --schema too, so that they may come
// after the command as well as before it; errors and --help are reported by the caller.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&e.dbURL, "db", e.dbURL, "database URL (env OUTBOXKIT_DATABASE_URL); also accepted before the command")
	fs.StringVar(&e.schema, "schema", e.schema, "Postgres schema or MySQL database holding the tables (env OUTBOXKIT_SCHEMA); "+
		"also accepted before the command")
	return fs
}

func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage of %s:\n", fs.Name())
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return err
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 && !strings.HasSuffix(fs.Name(), " show") {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

func (e *env) migrate(ctx context.Context, args []string) error {
	if err := parse(e.flags("migrate"), args, e.stdout); err != nil {
		return err
	}
	db, err := e.connect(ctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := pipeline.Migrate(ctx, db)
	if err != nil {
		return err
	}
	where := db.Info().Name + " " + db.Info().Schema
	if len(res.Applied) == 0 {
		fmt.Fprintf(e.stdout, "%s is up to date at version %d\n", where, res.Version)
	} else {
		fmt.Fprintf(e.stdout, "%s migrated to version %d (applied %v)\n", where, res.Version, res.Applied)
	}
	return nil
}

// Status is the JSON of "outboxctl status --json".
type Status struct {
	Outbox struct {
		Pending                      int     `json:"pending"`
		OldestPendingAgeSeconds      float64 `json:"oldest_pending_age_seconds"`
		DeadLettered                 int     `json:"dead_lettered"`
		OldestDeadLetteredAgeSeconds float64 `json:"oldest_dead_lettered_age_seconds"`
	} `json:"outbox"`
	Consumers []middleware.ConsumerStats `json:"consumers"`
	// Brokers is each consumer's backlog in the broker, with --broker and --topic.
	Brokers []ConsumerLag `json:"brokers,omitempty"`
	// LogRelays are the replication slots of the log relays (forwarder/pglog) that ran on this
	// outbox, on Postgres.
	LogRelays []forwarder.SlotStatus `json:"log_relays,omitempty"`
	// BinlogRelays are the binlog relay groups (forwarder/mysqlbinlog) that ran on this outbox, on
	// MySQL or MariaDB.
	BinlogRelays []BinlogRelay `json:"binlog_relays,omitempty"`
}

// BinlogRelay is a binlog relay group: its checkpoint, whether a relay of it reads the binary log
// (holds the group's lock), and the binary log written since the checkpoint. LagBytes is absent
// when unknown: before the first checkpoint, when Purged, or with LogError (most often a user
// without BINLOG MONITOR, REPLICATION CLIENT on MySQL, which it names).
type BinlogRelay struct {
	Relay                string    `json:"relay"`
	Progress             string    `json:"progress"` // "gtid" or "file"
	Position             string    `json:"position"` // the GTID set, or file:pos
	File                 string    `json:"file"`
	Pos                  uint64    `json:"pos"`
	CheckpointAt         time.Time `json:"checkpoint_at"`
	CheckpointAgeSeconds float64   `json:"checkpoint_age_seconds"`
	Active               bool      `json:"active"`
	Paused               bool      `json:"paused"`
	LagBytes             *int64    `json:"lag_bytes,omitempty"`
	Purged               bool      `json:"purged"`
	LogError             string    `json:"log_error,omitempty"`
}

// ConsumerLag is one consumer group's backlog in the broker. Unacked and OldestAgeSeconds are
// absent where the broker cannot tell them; Error says why nothing could be read.
type ConsumerLag struct {
	Consumer         string   `json:"consumer"`
	Topic            string   `json:"topic"`
	Waiting          int64    `json:"waiting"`
	Unacked          *int64   `json:"unacked,omitempty"`
	OldestAgeSeconds *float64 `json:"oldest_age_seconds,omitempty"`
	Error            string   `json:"error,omitempty"`
}

func (e *env) status(ctx context.Context, args []string) error {
	fs := e.flags("status")
	asJSON := fs.Bool("json", false, "print JSON")
	brokerURL := fs.String("broker", "", "also read each consumer's backlog from this broker (amqp://, kafka://, nats://, redis://)")
	topic := fs.String("topic", "", "the topic the consumers read, with --broker")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	if (*brokerURL == "") != (*topic == "") {
		return &usageError{"status: --broker and --topic go together: the backlog is per topic and consumer group"}
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	s, err := db.OutboxStats(ctx, time.Now())
	if err != nil {
		return err
	}
	consumers, err := middleware.Stats(ctx, db)
	if err != nil {
		return err
	}
	var st Status
	st.Outbox.Pending, st.Outbox.DeadLettered = s.Pending, s.DeadLettered
	st.Outbox.OldestPendingAgeSeconds = s.OldestPendingAge.Seconds()
	st.Outbox.OldestDeadLetteredAgeSeconds = s.OldestDeadLettered.Seconds()
	st.Consumers = consumers
	if st.Consumers == nil {
		st.Consumers = []middleware.ConsumerStats{}
	}
	if *brokerURL != "" {
		b, err := backends.Open(ctx, *brokerURL, backends.Options{})
		if err != nil {
			return fmt.Errorf("open the broker: %w", err)
		}
		defer b.Close()
		for _, c := range consumers {
			cl := ConsumerLag{Consumer: c.Consumer, Topic: *topic}
			l, err := b.Lag(ctx, *topic, c.Consumer)
			switch {
			case err != nil:
				cl.Error = err.Error()
			default:
				cl.Waiting = l.Waiting
				if l.HasUnacked {
					cl.Unacked = &l.Unacked
				}
				if l.HasAge {
					age := l.OldestAge.Seconds()
					cl.OldestAgeSeconds = &age
				}
			}
			st.Brokers = append(st.Brokers, cl)
		}
	}
	if st.LogRelays, err = e.logRelays(ctx, db.Info().Schema); err != nil {
		return err
	}
	if st.BinlogRelays, err = binlogRelays(ctx, db); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(st)
	}
	fmt.Fprintf(e.stdout, "outbox: %d pending (oldest %s), %d dead-lettered (oldest %s)\n",
		s.Pending, s.OldestPendingAge.Round(time.Millisecond), s.DeadLettered, s.OldestDeadLettered.Round(time.Second))
	if len(st.LogRelays) > 0 {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LOG RELAY\tSLOT\tMODE\tREADER\tWAL STATUS\tLAG\tRETAINED\tSAFE WAL")
		for _, r := range st.LogRelays {
			reader, status, safe := "none", r.WALStatus, "unlimited"
			if r.Active {
				reader = "attached"
			}
			if r.Paused {
				reader += " (PAUSED: publishes nothing, lag grows)"
			}
			if !r.Exists {
				status = "MISSING"
			}
			if r.SafeWALBytes >= 0 {
				safe = bytesText(r.SafeWALBytes)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Relay, r.Slot, r.Mode, reader, status,
				bytesText(r.LagBytes), bytesText(r.RetainedBytes), safe)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := printBinlogRelays(e.stdout, st.BinlogRelays); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	if st.Brokers == nil {
		fmt.Fprintln(tw, "CONSUMER\tPROCESSED\tDUPLICATES\tDEAD LETTERS\tPARKED")
		for _, c := range consumers {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", c.Consumer, c.Processed, c.Duplicates, c.DeadLetters, c.Parked)
		}
		return tw.Flush()
	}
	fmt.Fprintf(tw, "CONSUMER\tPROCESSED\tDUPLICATES\tDEAD LETTERS\tPARKED\tWAITING IN %s\tUNACKED\tOLDEST\n", *topic)
	for i, c := range consumers {
		l := st.Brokers[i]
		waiting, unacked, oldest := fmt.Sprint(l.Waiting), "-", "-"
		if l.Error != "" {
			waiting = "? (" + l.Error + ")"
		}
		if l.Unacked != nil {
			unacked = fmt.Sprint(*l.Unacked)
		}
		if l.OldestAgeSeconds != nil {
			oldest = (time.Duration(*l.OldestAgeSeconds * float64(time.Second))).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", c.Consumer, c.Processed, c.Duplicates, c.DeadLetters, c.Parked, waiting, unacked, oldest)
	}
	return tw.Flush()
}

// logRelays reads the slots of the log relays on a Postgres outbox; other databases have none.
func (e *env) logRelays(ctx context.Context, schema string) ([]forwarder.SlotStatus, error) {
	lower := strings.ToLower(e.dbURL)
	if !strings.HasPrefix(lower, "postgres://") && !strings.HasPrefix(lower, "postgresql://") {
		return nil, nil
	}
	pool, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		return nil, fmt.Errorf("read the log relays' slots: %w", err)
	}
	defer pool.Close()
	return pglog.ReadSlots(ctx, pool, schema)
}

// binlogRelays reads the binlog relay groups of a MySQL or MariaDB outbox; other databases have
// none.
func binlogRelays(ctx context.Context, db *store.DB) ([]BinlogRelay, error) {
	if db.Dialect != "mysql" {
		return nil, nil
	}
	groups, err := mysqlbinlog.ReadStatus(ctx, db.SQL, db.Info().Schema)
	if err != nil {
		return nil, err
	}
	out := make([]BinlogRelay, len(groups))
	for i, g := range groups {
		out[i] = BinlogRelay{Relay: g.Relay, Progress: g.Progress, Position: g.Position, File: g.File, Pos: g.Pos,
			CheckpointAt: g.CheckpointAt, CheckpointAgeSeconds: g.CheckpointAge.Seconds(), Active: g.Active, Paused: g.Paused,
			Purged: g.Purged, LogError: g.LogError}
		if g.LagBytes >= 0 {
			out[i].LagBytes = &g.LagBytes
		}
	}
	return out, nil
}

// printBinlogRelays prints the binlog relay groups, one line each, and why the lag is unknown
// when it is.
func printBinlogRelays(w io.Writer, groups []BinlogRelay) error {
	if len(groups) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BINLOG RELAY\tPROGRESS\tPOSITION\tREADER\tCHECKPOINT\tLAG")
	var logErr string
	for _, g := range groups {
		reader, lag := "none", "?"
		if g.Active {
			reader = "reading"
		}
		if g.Paused {
			reader += " (PAUSED: publishes nothing, lag grows)"
		}
		switch {
		case g.Purged:
			lag = "PURGED: its binary log file is gone, the next start recovers from the table"
		case g.LagBytes != nil:
			lag = bytesText(*g.LagBytes)
		case g.LogError != "":
			logErr = g.LogError
		}
		age := (time.Duration(g.CheckpointAgeSeconds * float64(time.Second))).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", g.Relay, g.Progress, g.Position, reader, age, lag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if logErr != "" {
		fmt.Fprintf(w, "binlog relays' lag unknown: %s\n", logErr)
	}
	return nil
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (e *env) prune(ctx context.Context, args []string) error {
	fs := e.flags("prune")
	published := fs.Duration("published-older-than", 24*time.Hour, "delete outbox rows published longer ago than this")
	inbox := fs.Duration("inbox-older-than", middleware.DefaultDedupWindow,
		"delete inbox rows older than this: the dedup window, keep it longer than any redelivery or replay")
	batch := fs.Int("batch", 1000, "rows per DELETE statement")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	if *published <= 0 || *inbox <= 0 || *batch < 1 {
		return usagef("prune: --published-older-than and --inbox-older-than must be positive durations (e.g. 24h), --batch at least 1")
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	nOutbox, err := forwarder.PrunePublished(ctx, db, time.Now().Add(-*published), *batch)
	if err != nil {
		return err
	}
	nInbox, err := middleware.PruneInbox(ctx, middleware.PruneConfig{Store: db, BatchSize: *batch}, *inbox)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "deleted %d published outbox rows and %d inbox rows\n", nOutbox, nInbox)
	return nil
}

// filterFlags are the dead-letter filters both sides share.
type filterFlags struct {
	ids, uuids           *string
	topic, key, consumer *string
	errText              *string
	since, until         *string
	limit                *int
	all, asJSON, dryRun  *bool
	again                *bool
	broker               *string
}

func addFilters(fs *flag.FlagSet, side string, replay bool) *filterFlags {
	f := &filterFlags{}
	idName := "seq"
	if side == "inbox" {
		idName = "id"
	}
	f.ids = fs.String(idName, "", "comma-separated "+idName+"s")
	f.uuids = fs.String("uuid", "", "comma-separated message UUIDs")
	f.topic = fs.String("topic", "", "topic")
	f.errText = fs.String("error", "", "text the error (outbox) or reason (inbox) contains")
	f.since = fs.String("since", "", "dead-lettered at or after: RFC 3339 time, or a duration ago (2h)")
	f.until = fs.String("until", "", "dead-lettered before: RFC 3339 time, or a duration ago")
	if side == "outbox" {
		f.key = fs.String("key", "", "partition key")
	} else {
		f.consumer = fs.String("consumer", "", "consumer name")
	}
	if replay {
		f.all = fs.Bool("all", false, "replay everything the filters select, even with no filter")
		f.dryRun = fs.Bool("dry-run", false, "list what would be replayed, change nothing")
		if side == "inbox" {
			f.broker = fs.String("broker", os.Getenv("OUTBOXKIT_BROKER_URL"), "broker URL to re-publish to (env OUTBOXKIT_BROKER_URL)")
			f.again = fs.Bool("again", false, "also replay dead letters replayed before (consumers that processed them absorb them)")
		}
	} else {
		f.limit = fs.Int("limit", 100, "at most this many")
		f.asJSON = fs.Bool("json", false, "print JSON")
	}
	return f
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseIDs(flagName, s string) ([]int64, error) {
	var out []int64
	for _, p := range splitList(s) {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 1 {
			return nil, usagef("--%s %q: want positive integers, comma-separated", flagName, p)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseWhen(flagName, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-11-29T10:00:00Z) or a duration ago (90m, 2h)", flagName, s)
}
