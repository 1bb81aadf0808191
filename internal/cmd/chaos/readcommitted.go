package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// rawRecord is one record of the soak's topic as a consumer without an inbox is handed it.
type rawRecord struct {
	partition int32
	offset    int64
	key, uuid string
}

// rawVerdict is what the read_committed reader saw, held against the outbox.
type rawVerdict struct {
	records, events                 int
	duplicates, missing, inversions int
	foreign                         int // records that are no published outbox event (or under another key)
}

// readCommitted reads topic from its start with a franz-go consumer at read_committed, without a
// group (nothing is committed, nobody else's offsets move), up to each partition's last stable
// offset: every record of a committed transaction, or of none, and nothing of an aborted one.
// Transactions' markers are kept only to know where a partition ends.
func readCommitted(ctx context.Context, brokerURL, topic string) ([]rawRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	broker := strings.TrimPrefix(brokerURL, "kafka://")
	adm, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		return nil, err
	}
	ends, err := kadm.NewClient(adm).ListCommittedOffsets(ctx, topic)
	adm.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("the last stable offsets of %s: %w", topic, err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []rawRecord
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %d records of %s in 2 minutes; partitions (to their last stable offset) %v not read to their end", len(out), topic, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				rec := rawRecord{partition: r.Partition, offset: r.Offset, key: string(r.Key)}
				for _, h := range r.Headers {
					if h.Key == "_watermill_message_uuid" {
						rec.uuid = strings.ToLower(string(h.Value))
					}
				}
				out = append(out, rec)
			}
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].partition != out[j].partition {
			return out[i].partition < out[j].partition
		}
		return out[i].offset < out[j].offset
	})
	return out, nil
}

// checkReadCommitted holds what the reader read against the outbox's published rows: each row's
// event came (no gap), once (no duplicate), and each key's events in the outbox's order of that key
// (no inversion: an event first read after a later one of its key); no other record came. With
// transactions a duplicate is a violation; without, information: a relay that dies between its
// publish and its mark publishes the rows again, and only an inbox absorbs them.
func checkReadCommitted(ctx context.Context, biz tables, recs []rawRecord, txn bool, v *verdict) (rawVerdict, error) {
	events := map[string]outboxEvent{}
	if err := biz.rows(ctx, `SELECT uuid, partition_key, seq FROM {{t}}.outbox WHERE published_at IS NOT NULL`, func(c []string) error {
		seq, err := integer[int64](c[2], "outbox seq")
		events[strings.ToLower(c[0])] = outboxEvent{key: c[1], seq: seq}
		return err
	}); err != nil {
		return rawVerdict{}, err
	}
	return judgeReadCommitted(events, recs, txn, v), nil
}

// outboxEvent is a published outbox row: its partition key and its place in the outbox.
type outboxEvent struct {
	key string
	seq int64
}

// judgeReadCommitted is checkReadCommitted's verdict on recs, given the published events by uuid.
func judgeReadCommitted(events map[string]outboxEvent, recs []rawRecord, txn bool, v *verdict) rawVerdict {
	rv := rawVerdict{records: len(recs), events: len(events)}
	const reader = "read_committed, no inbox: "
	gaps := v.add(reader + "every published outbox event is in the topic (no gap)")
	once := &invariant{} // added to the verdict only with transactions
	if txn {
		once = v.add(reader + "no event twice (no duplicate)")
	}
	inOrder := v.add(reader + "each key's events first came in the key's outbox order (no inversion)")
	ours := v.add(reader + "every record is a published outbox event, under its key")

	seen := map[string]bool{}
	lastSeq := map[string]int64{} // per key, the highest seq read so far
	for _, r := range recs {
		ours.checked++
		ev, ok := events[r.uuid]
		if !ok || ev.key != r.key {
			rv.foreign++
			ours.fail("record %d@%d (key %q, uuid %q) is no published outbox event of that key", r.partition, r.offset, r.key, r.uuid)
			continue
		}
		once.checked++
		if seen[r.uuid] {
			rv.duplicates++
			once.fail("event %s of key %s came again at %d@%d", r.uuid, r.key, r.partition, r.offset)
			continue
		}
		seen[r.uuid] = true
		inOrder.checked++
		if last, ok := lastSeq[ev.key]; ok && ev.seq < last {
			rv.inversions++
			inOrder.fail("key %s: event seq %d came at %d@%d after seq %d", ev.key, ev.seq, r.partition, r.offset, last)
		}
		lastSeq[ev.key] = max(lastSeq[ev.key], ev.seq)
	}
	for id, ev := range events {
		gaps.checked++
		if !seen[id] {
			rv.missing++
			gaps.fail("event %s (key %s, seq %d) is not in the topic", id, ev.key, ev.seq)
		}
	}
	return rv
}
