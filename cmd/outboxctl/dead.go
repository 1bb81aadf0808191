package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// filter parses the dead-letter filter flags of side before anything touches the database.
func (f *filterFlags) filter(side string) (store.DeadLetterFilter, error) {
	idName := map[string]string{"outbox": "seq", "inbox": "id"}[side]
	ids, err := parseIDs(idName, *f.ids)
	if err != nil {
		return store.DeadLetterFilter{}, err
	}
	from, err := parseWhen("since", *f.since)
	if err != nil {
		return store.DeadLetterFilter{}, err
	}
	until, err := parseWhen("until", *f.until)
	if err != nil {
		return store.DeadLetterFilter{}, err
	}
	out := store.DeadLetterFilter{IDs: ids, MessageIDs: splitList(*f.uuids), Topic: *f.topic,
		ReasonContains: *f.errText, From: from, Until: until}
	if f.key != nil {
		out.PartitionKey = *f.key
	}
	if f.consumer != nil {
		out.Consumer = *f.consumer
	}
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

// deadLetters lists side's dead letters.
func deadLetters(ctx context.Context, db *store.DB, side string, filter store.DeadLetterFilter) ([]store.DeadLetter, error) {
	if side == "outbox" {
		return db.OutboxDeadLetters(ctx, filter)
	}
	return db.InboxDeadLetters(ctx, filter)
}

func (e *env) deadList(ctx context.Context, side string, args []string) error {
	fs := e.flags(side + " dead list")
	ff := addFilters(fs, side, false)
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	filter, err := ff.filter(side)
	if err != nil {
		return err
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	letters, err := deadLetters(ctx, db, side, filter)
	if err != nil {
		return err
	}
	if *ff.asJSON {
		return json.NewEncoder(e.stdout).Encode(nonNil(letters))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	if side == "outbox" {
		fmt.Fprintln(tw, "SEQ\tUUID\tTOPIC\tKEY\tATTEMPTS\tDEAD SINCE\tLAST ERROR")
		for _, d := range letters {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.MessageID, d.Topic, d.PartitionKey, d.Attempts,
				d.DeadLetteredAt.UTC().Format(time.RFC3339), oneLine(d.Reason))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "ID\tCONSUMER\tUUID\tTOPIC\tDELIVERIES\tDEAD SINCE\tREASON")
	for _, d := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Consumer, d.MessageID, d.Topic, d.Attempts,
			d.DeadLetteredAt.UTC().Format(time.RFC3339), oneLine(d.Reason))
	}
	return tw.Flush()
}

func (e *env) deadShow(ctx context.Context, side string, args []string) error {
	fs := e.flags(side + " dead show")
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
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	letters, err := deadLetters(ctx, db, side, store.DeadLetterFilter{IDs: []int64{id}, IncludeReplayed: true})
	if err != nil {
		return err
	}
	if len(letters) != 1 {
		return fmt.Errorf("no dead letter with %s %d in the %s (already replayed, or never dead-lettered)", idName, id, side)
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(showable{letters[0], string(letters[0].Payload)})
}

// showable prints a dead letter with its payload as text beside the raw bytes.
type showable struct {
	Letter      store.DeadLetter `json:"dead_letter"`
	PayloadText string           `json:"payload_text"`
}

func (e *env) deadReplay(ctx context.Context, side string, args []string) error {
	fs := e.flags(side + " dead replay")
	ff := addFilters(fs, side, true)
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	filter, err := ff.filter(side)
	if err != nil {
		return err
	}
	if side == "inbox" && !*ff.dryRun && *ff.broker == "" {
		return usagef("inbox dead replay re-publishes to the broker: pass --broker URL (amqp://, kafka://, nats://, redis://, postgres://) or set OUTBOXKIT_BROKER_URL")
	}
	if !filter.All && filter.Empty() {
		// A forgotten filter must never replay everything: say what to pass.
		which := "--seq, --uuid, --topic, --key, --error, --since, --until"
		if side == "inbox" {
			which = "--id, --uuid, --consumer, --topic, --error, --since, --until"
		}
		return usagef("%s dead replay: name what to replay (%s), or pass --all to replay every dead letter", side, which)
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	if *ff.dryRun {
		filter.Limit = -1
		letters, err := deadLetters(ctx, db, side, filter)
		if err != nil {
			return err
		}
		for _, d := range letters {
			if side == "outbox" {
				fmt.Fprintf(e.stdout, "would replay outbox seq %d (uuid %s, topic %s, key %s)\n", d.ID, d.MessageID, d.Topic, d.PartitionKey)
			} else {
				fmt.Fprintf(e.stdout, "would replay dead letter %d (consumer %s, uuid %s) to %s\n", d.ID, d.Consumer, d.MessageID, d.Topic)
			}
		}
		fmt.Fprintf(e.stdout, "dry run: %d %s would be replayed\n", len(letters), map[string]string{"outbox": "rows", "inbox": "messages"}[side])
		return nil
	}
	if side == "outbox" {
		letters, err := db.ReplayOutboxDeadLetters(ctx, filter)
		if err != nil {
			return err
		}
		seqs := make([]int64, len(letters))
		for i, d := range letters {
			seqs[i] = d.ID
		}
		fmt.Fprintf(e.stdout, "replayed %d outbox rows %v: the forwarder publishes them again\n", len(seqs), seqs)
		return nil
	}
	broker, err := backends.Open(ctx, *ff.broker, backends.Options{})
	if err != nil {
		return err
	}
	defer broker.Close()
	letters, err := middleware.ReplayInboxDeadLetters(ctx, middleware.ReplayConfig{Store: db, Publisher: broker.Publisher}, filter)
	for _, d := range letters {
		fmt.Fprintf(e.stdout, "replayed dead letter %d (consumer %s, uuid %s) to %s\n", d.ID, d.Consumer, d.MessageID, d.Topic)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "replayed %d messages: a consumer that already processed one absorbs it as a duplicate\n", len(letters))
	return nil
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
