package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// kafkaLag sums, over the topic's partitions, the newest offset minus the group's committed one,
// and reads the timestamp of the first record not committed on each partition behind. One client
// (franz-go's, as the subscriber's, with kadm's requests) serves every read, every group, every
// scrape; a failed read drops it, the next dials again. It reads and never writes: a topic that
// does not exist is an error, not created.
type kafkaLag struct {
	conn   kafkaConn
	mu     sync.Mutex
	client *kgo.Client
}

// kafkaAgeWait bounds the wait for the records whose age a read reports.
const kafkaAgeWait = 3 * time.Second

func (k *kafkaLag) read(ctx context.Context, topic, group string) (backends.Lag, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client == nil {
		// Not a group member: a direct consumer, of the partitions a read adds, for the ages.
		// It reads as the group's members do (isolation), and keeps the transactions' markers: a
		// marker read where a record was looked for says nothing waits there.
		client, err := kgo.NewClient(append(k.conn.kgoOpts(), kgo.FetchMaxWait(kafkaAgeWait),
			kgo.FetchIsolationLevel(k.conn.isolation()), kgo.KeepControlRecords(),
			kgo.FetchMaxBytes(1<<20), kgo.FetchMaxPartitionBytes(64<<10))...) // one record's worth: Kafka sends a whole first batch anyway
		if err != nil {
			return backends.Lag{}, classifyKafka(err)
		}
		k.client = client
	}
	l, err := kafkaGroupLag(ctx, k.client, topic, group)
	if err != nil {
		k.client.Close()
		k.client = nil
	}
	return l, err
}

func (k *kafkaLag) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil {
		k.client.Close()
		k.client = nil
	}
	return nil
}

func kafkaGroupLag(ctx context.Context, client *kgo.Client, topic, group string) (backends.Lag, error) {
	adm := kadm.NewClient(client)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return backends.Lag{}, classifyKafka(fmt.Errorf("topic %s does not exist: %w", topic, err))
	}
	if err != nil {
		return backends.Lag{}, classifyKafka(fmt.Errorf("read the newest offsets of topic %s: %w", topic, err))
	}
	commits, err := adm.FetchOffsets(ctx, group) // a refusal is an error; a partition's own, no commit
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group never seen — no member has joined it, nothing is committed; kfake says so to the
		// OffsetFetch versions kadm sends, the version Sarama sent got no offsets — starts from
		// the oldest record, as the subscriber does: everything waits for it.
		commits, err = nil, nil
	}
	if err != nil {
		return backends.Lag{}, classifyKafka(fmt.Errorf("read the offsets group %s committed: %w", group, err))
	}
	committed := make(map[int32]int64, len(ends[topic]))
	var uncommitted bool
	for p := range ends[topic] {
		committed[p] = -1
		if c, ok := commits.Lookup(topic, p); ok && c.Err == nil {
			committed[p] = c.At
		}
		uncommitted = uncommitted || committed[p] < 0
	}
	if uncommitted { // nothing committed: the group starts from the oldest record
		starts, err := adm.ListStartOffsets(ctx, topic)
		if err == nil {
			err = starts.Error()
		}
		if err != nil {
			return backends.Lag{}, classifyKafka(fmt.Errorf("read the oldest offsets of topic %s: %w", topic, err))
		}
		for p, c := range committed {
			if c >= 0 {
				continue
			}
			s, ok := starts.Lookup(topic, p)
			if !ok {
				return backends.Lag{}, classifyKafka(fmt.Errorf("read the oldest offsets of topic %s: none for partition %d", topic, p))
			}
			committed[p] = s.Offset
		}
	}
	var l backends.Lag
	behind := make(map[int32][2]int64)
	for p, end := range ends[topic] {
		if n := end.Offset - committed[p]; n > 0 {
			l.Waiting += n
			behind[p] = [2]int64{committed[p], end.Offset}
		}
	}
	ages, markersOnly := kafkaRecordAges(ctx, client, topic, behind)
	for _, age := range ages {
		if age > l.OldestAge || !l.HasAge {
			l.OldestAge, l.HasAge = age, true
		}
	}
	// Offsets behind the committed one that hold only transactions' markers (and, at
	// read_committed, aborted records) wait for nobody: the last record of a transactional
	// producer is followed by its commit marker, which a caught-up group never commits past.
	for p := range markersOnly {
		l.Waiting -= behind[p][1] - behind[p][0]
	}
	return l, nil
}

// kafkaRecordAges reads, on each partition of from (its offsets [from, end)), the first record at
// or after from, and returns how old each one's timestamp is; and the partitions where only
// transactions' markers lie before end: nothing waits there. A partition whose record does not
// come within kafkaAgeWait (or ctx) is in neither.
func kafkaRecordAges(ctx context.Context, client *kgo.Client, topic string, from map[int32][2]int64) (ages map[int32]time.Duration, markersOnly map[int32]bool) {
	ages, markersOnly = make(map[int32]time.Duration, len(from)), map[int32]bool{}
	if len(from) == 0 {
		return ages, markersOnly
	}
	offsets := make(map[int32]kgo.Offset, len(from))
	for p, o := range from {
		offsets[p] = kgo.NewOffset().At(o[0])
	}
	client.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets})
	defer client.RemoveConsumePartitions(map[string][]int32{topic: slices.Collect(maps.Keys(from))})
	ctx, cancel := context.WithTimeout(ctx, kafkaAgeWait)
	defer cancel()
	for len(ages)+len(markersOnly) < len(from) && ctx.Err() == nil {
		// kgo hands out no record before the offset a partition was added at, and the removal of
		// an earlier read's partitions dropped what it had fetched for them.
		client.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			_, aged := ages[r.Partition]
			if r.Topic != topic || aged || markersOnly[r.Partition] {
				return
			}
			switch {
			case !r.Attrs.IsControl():
				ages[r.Partition] = brokerio.AgeOf(r.Timestamp)
			case r.Offset >= from[r.Partition][1]-1:
				markersOnly[r.Partition] = true // the last offset read, and no record before it
			}
		})
	}
	return ages, markersOnly
}
