package kafkabackend

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/logs"
)

// horizonPrefix starts the metadata a member commits with a partition's offset: the first offset
// no member of the group has been handed yet. A member commits a larger horizon before it hands out
// a record at or past the committed one, so that whoever reads the partition next knows which
// records may have been delivered before (below the horizon) and which are first deliveries.
const horizonPrefix = "outboxkit:horizon="

// horizonAhead is the farthest a member keeps the horizon past what it has handed out (or twice
// unacked, if more). It keeps it about twice what the partition hands out in kafkaHorizonEvery
// ahead, at least kafkaAheadMin, so that a commit covers many records. A member that ends its claim
// in order commits the horizon of what it did hand out; after a crash, the records between what was
// handed out and the horizon, which no one was handed, are taken for redeliveries (counted once
// more than they were delivered): a few seconds of the partition's records, not horizonAhead.
const horizonAhead = 256

// kafkaAheadMin is the least a member keeps the horizon past what it has handed out.
const kafkaAheadMin = 16

// kafkaHorizonEvery is how often a member moves the horizon to follow the partition's rate.
const kafkaHorizonEvery = time.Second

// kafkaRetry paces the attempts to read a group's offsets when partitions are assigned.
var kafkaRetry = outboxkit.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}

// kafkaHorizon is what a claim starts from: records below vouchFrom may have been handed out
// before; handedFrom is where its own horizon starts (-1: only past what it hands out); committed
// is the horizon committed (-1: none).
type kafkaHorizon struct{ vouchFrom, handedFrom, committed int64 }

// horizons reads the offsets committed for partitions, with their horizons, retrying for a while.
// When they cannot be read every record of the partition is taken for a redelivery.
func (c *kafkaConsumer) horizons(ctx context.Context, partitions []int32) map[int32]kafkaHorizon {
	deadline := time.Now().Add(kafkaRebalanceTimeout / 2)
	for attempt := 1; ; attempt++ {
		h, err := c.readHorizons(ctx, partitions)
		if err == nil {
			return h
		}
		wait := kafkaRetry.Delay(attempt)
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			logs.Warn(c.s.logger, "Cannot read the group's offsets; the partitions' records count as redeliveries", err, c.fields)
			h := map[int32]kafkaHorizon{}
			for _, p := range partitions {
				h[p] = kafkaHorizon{vouchFrom: math.MaxInt64, handedFrom: -1, committed: -1}
			}
			return h
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (c *kafkaConsumer) readHorizons(ctx context.Context, partitions []int32) (map[int32]kafkaHorizon, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = c.s.group
	t := kmsg.NewOffsetFetchRequestTopic()
	t.Topic, t.Partitions = c.topic, partitions
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	got := map[int32]kmsg.OffsetFetchResponseTopicPartition{}
	for _, t := range resp.Topics {
		if t.Topic == c.topic {
			for _, p := range t.Partitions {
				got[p.Partition] = p
			}
		}
	}
	h := map[int32]kafkaHorizon{}
	var foreign []int32
	for _, p := range partitions {
		block, ok := got[p]
		if !ok {
			return nil, fmt.Errorf("read the committed offset of %s/%d: not in the response", c.topic, p)
		}
		if err := kerr.ErrorForCode(block.ErrorCode); err != nil {
			return nil, fmt.Errorf("read the committed offset of %s/%d: %w", c.topic, p, err)
		}
		if block.Metadata != nil {
			if v, ok := strings.CutPrefix(*block.Metadata, horizonPrefix); ok {
				if horizon, err := strconv.ParseInt(v, 10, 64); err == nil {
					h[p] = kafkaHorizon{vouchFrom: horizon, handedFrom: horizon, committed: horizon}
					continue
				}
			}
		}
		if block.Offset < 0 {
			// nothing committed: nobody handed anything out (a member commits first)
			h[p] = kafkaHorizon{vouchFrom: 0, handedFrom: 0, committed: -1}
			continue
		}
		foreign = append(foreign, p)
	}
	if len(foreign) == 0 {
		return h, nil
	}
	// Committed by another client, which says nothing of what it read: only what arrives from now
	// on was never delivered.
	lreq := kmsg.NewPtrListOffsetsRequest()
	lreq.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = c.topic
	for _, p := range foreign {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp, lp.CurrentLeaderEpoch = p, -1, -1 // the newest
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("read the newest offset of %s/%d: %w", c.topic, p.Partition, err)
			}
			h[p.Partition] = kafkaHorizon{vouchFrom: p.Offset, handedFrom: p.Offset, committed: -1}
		}
	}
	for _, p := range foreign {
		if _, ok := h[p]; !ok {
			return nil, fmt.Errorf("read the newest offset of %s/%d: not in the response", c.topic, p)
		}
	}
	return h, nil
}
