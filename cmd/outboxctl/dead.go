package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/middleware"
)

func (f *filterFlags) outbox() (forwarder.DeadLetterFilter, error) {
	seqs, err := parseIDs("seq", *f.ids)
	if err != nil {
		return forwarder.DeadLetterFilter{}, err
	}
	from, err := parseWhen("since", *f.since)
	if err != nil {
		return forwarder.DeadLetterFilter{}, err
	}
	until, err := parseWhen("until", *f.until)
	if err != nil {
		return forwarder.DeadLetterFilter{}, err
	}
	out := forwarder.DeadLetterFilter{Seqs: seqs, UUIDs: splitList(*f.uuids), Topic: *f.topic, PartitionKey: *f.key,
		ErrorContains: *f.errText, From: from, Until: until}
	if f.limit != nil {
		out.Limit = *f.limit
	}
	if f.all != nil {
		out.All = *f.all
	}
	return out, nil
}

func (f *filterFlags) inbox() (middleware.DeadLetterFilter, error) {
	ids, err := parseIDs("id", *f.ids)
	if err != nil {
		return middleware.DeadLetterFilter{}, err
	}
	from, err := parseWhen("since", *f.since)
	if err != nil {
		return middleware.DeadLetterFilter{}, err
	}
	until, err := parseWhen("until", *f.until)
	if err != nil {
		return middleware.DeadLetterFilter{}, err
	}
	out := middleware.DeadLetterFilter{Consumer: *f.consumer, IDs: ids, MessageIDs: splitList(*f.uuids), Topic: *f.topic,
		ReasonContains: *f.errText, From: from, Until: until}
	if f.limit != nil {
		out.Limit = *f.limit
	}
	if f.all != nil {
		out.All = *f.all
	}
	if f.again != nil {
		out.IncludeReplayed = *f.again
	}
	return out, nil
}

// both parses the filter flags of side before anything touches the database.
func (f *filterFlags) both(side string) (forwarder.DeadLetterFilter, middleware.DeadLetterFilter, error) {
	if side == "outbox" {
		o, err := f.outbox()
		return o, middleware.DeadLetterFilter{}, err
	}
	i, err := f.inbox()
	return forwarder.DeadLetterFilter{}, i, err
}

func (e *env) deadList(ctx context.Context, side string, args []string) error {
	fs := flags(side + " dead list")
	ff := addFilters(fs, side, false)
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	outboxFilter, inboxFilter, err := ff.both(side)
	if err != nil {
		return err
	}
	pool, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	if side == "outbox" {
		letters, err := e.outboxDead(ctx, outboxFilter)
		if err != nil {
			return err
		}
		if *ff.asJSON {
			return json.NewEncoder(e.stdout).Encode(nonNil(letters))
		}
		fmt.Fprintln(tw, "SEQ\tUUID\tTOPIC\tKEY\tATTEMPTS\tDEAD SINCE\tLAST ERROR")
		for _, d := range letters {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Seq, d.UUID, d.Topic, d.PartitionKey, d.Attempts,
				d.DeadLetteredAt.UTC().Format(time.RFC3339), oneLine(d.LastError))
		}
		return tw.Flush()
	}
	letters, err := middleware.ListDeadLetters(ctx, pool, e.schema, inboxFilter)
	if err != nil {
		return err
	}
	if *ff.asJSON {
		return json.NewEncoder(e.stdout).Encode(nonNil(letters))
	}
	fmt.Fprintln(tw, "ID\tCONSUMER\tUUID\tTOPIC\tDELIVERIES\tDEAD SINCE\tREASON")
	for _, d := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Consumer, d.MessageID, d.Topic, d.Deliveries,
			d.DeadLetteredAt.UTC().Format(time.RFC3339), oneLine(d.Reason))
	}
	return tw.Flush()
}

func (e *env) deadShow(ctx context.Context, side string, args []string) error {
	fs := flags(side + " dead show")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	idName := map[string]string{"outbox": "SEQ", "inbox": "ID"}[side]
	if fs.NArg() != 1 {
		return usagef("%s dead show takes one %s", side, idName)
	}
	id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
	if err != nil || id < 1 {
		return usagef("%s dead show: %s %q is not a positive integer", side, idName, fs.Arg(0))
	}
	pool, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var found any
	if side == "outbox" {
		letters, err := e.outboxDead(ctx, forwarder.DeadLetterFilter{Seqs: []int64{id}})
		if err != nil {
			return err
		}
		if len(letters) == 1 {
			found = showable{letters[0], string(letters[0].Payload)}
		}
	} else {
		letters, err := middleware.ListDeadLetters(ctx, pool, e.schema, middleware.DeadLetterFilter{IDs: []int64{id}})
		if err != nil {
			return err
		}
		if len(letters) == 1 {
			found = showable{letters[0], string(letters[0].Payload)}
		}
	}
	if found == nil {
		return fmt.Errorf("no dead letter with %s %d in the %s (already replayed, or never dead-lettered)", idName, id, side)
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(found)
}

// showable prints a dead letter with its payload as text beside the raw bytes.
type showable struct {
	Letter      any    `json:"dead_letter"`
	PayloadText string `json:"payload_text"`
}

func (e *env) deadReplay(ctx context.Context, side string, args []string) error {
	fs := flags(side + " dead replay")
	ff := addFilters(fs, side, true)
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	outboxFilter, inboxFilter, err := ff.both(side)
	if err != nil {
		return err
	}
	if side == "inbox" && !*ff.dryRun && *ff.broker == "" {
		return usagef("inbox dead replay re-publishes to the broker: pass --broker URL (amqp://, kafka://, nats://, redis://, postgres://) or set OUTBOXKIT_BROKER_URL")
	}
	pool, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if side == "outbox" {
		filter := outboxFilter
		if *ff.dryRun {
			filter.Limit = 1 << 30
			letters, err := e.outboxDead(ctx, filter)
			if err != nil {
				return err
			}
			for _, d := range letters {
				fmt.Fprintf(e.stdout, "would replay outbox seq %d (uuid %s, topic %s, key %s)\n", d.Seq, d.UUID, d.Topic, d.PartitionKey)
			}
			fmt.Fprintf(e.stdout, "dry run: %d rows would be replayed\n", len(letters))
			return nil
		}
		ob, err := forwarder.NewOutbox(pool, forwarder.OutboxConfig{Schema: e.schema})
		if err != nil {
			return usagef("%v", err)
		}
		seqs, err := ob.ReplayDeadLetters(ctx, filter)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "replayed %d outbox rows %v: the forwarder publishes them again\n", len(seqs), seqs)
		return nil
	}

	filter := inboxFilter
	if *ff.dryRun {
		filter.Limit = 1 << 30
		letters, err := middleware.ListDeadLetters(ctx, pool, e.schema, filter)
		if err != nil {
			return err
		}
		for _, d := range letters {
			fmt.Fprintf(e.stdout, "would replay dead letter %d (consumer %s, uuid %s) to %s\n", d.ID, d.Consumer, d.MessageID, d.Topic)
		}
		fmt.Fprintf(e.stdout, "dry run: %d messages would be replayed\n", len(letters))
		return nil
	}
	broker, err := backends.Open(ctx, *ff.broker, backends.Options{})
	if err != nil {
		return err
	}
	defer broker.Close()
	pub := broker.Publisher
	filter.Limit = 1 << 30
	letters, err := middleware.ReplayDeadLetters(ctx, middleware.ReplayConfig{Pool: pool, Schema: e.schema, Publisher: pub}, filter)
	for _, d := range letters {
		fmt.Fprintf(e.stdout, "replayed dead letter %d (consumer %s, uuid %s) to %s\n", d.ID, d.Consumer, d.MessageID, d.Topic)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "replayed %d messages: a consumer that already processed one absorbs it as a duplicate\n", len(letters))
	return nil
}

func (e *env) outboxDead(ctx context.Context, filter forwarder.DeadLetterFilter) ([]forwarder.DeadLetter, error) {
	ob, err := forwarder.NewOutbox(e.pool, forwarder.OutboxConfig{Schema: e.schema})
	if err != nil {
		return nil, usagef("%v", err)
	}
	return ob.DeadLetters(ctx, filter)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func oneLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i] + " …"
		}
	}
	return s
}
