// The claims: entries of gone or idle consumers taken over, and this consumer's own taken back.

package redisbackend

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit/internal/logs"
)

// claimLoop takes over, every redisClaimEvery, the pending entries of the group's consumers that
// are gone (a heartbeating consumer without its key), and of the others those idle for ClaimAfter;
// and takes back this consumer's own that the subscription does not hold.
func (r *redisSubscription) claimLoop(ctx context.Context) {
	tick := time.NewTicker(redisClaimEvery)
	defer tick.Stop()
	for {
		if err := r.claimOnce(ctx); err != nil && ctx.Err() == nil {
			r.s.logger.Debug("Cannot look for entries to take over", r.fields.Add(watermill.LogFields{"err": err}))
		}
		if err := r.takeBack(ctx); err != nil && ctx.Err() == nil {
			r.s.logger.Debug("Cannot look for entries of this consumer to take back", r.fields.Add(watermill.LogFields{"err": err}))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *redisSubscription) claimOnce(ctx context.Context) error {
	consumers, err := r.client.XInfoConsumers(ctx, r.topic, r.s.group).Result()
	if err != nil {
		return err
	}
	for _, c := range consumers {
		if c.Name == r.consumer {
			continue
		}
		minIdle := r.s.claimAfter
		if strings.HasSuffix(c.Name, heartbeatSuffix) {
			alive, err := r.client.Exists(ctx, aliveKey(r.s.group, c.Name)).Result()
			if err != nil {
				return err
			}
			if alive > 0 {
				continue // alive, however slow: never robbed
			}
			minIdle = redisGoneIdle
		}
		if c.Pending == 0 {
			// Forgotten only once silent for a while: deleting a consumer drops what it reads
			// meanwhile from the pending list, for good.
			if c.Idle > redisForgetAfter || minIdle == redisGoneIdle && c.Idle > 2*redisAliveFor {
				r.client.XGroupDelConsumer(ctx, r.topic, r.s.group, c.Name)
			}
			continue
		}
		if err := r.claimFrom(ctx, c.Name, minIdle); err != nil {
			return err
		}
	}
	return nil
}

// claimFrom claims the entries of consumer idle for at least minIdle, in id order, and queues them
// to be handed out.
func (r *redisSubscription) claimFrom(ctx context.Context, consumer string, minIdle time.Duration) error {
	for {
		pending, err := r.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.topic, Group: r.s.group,
			Idle: minIdle, Start: "-", End: "+", Count: int64(max(r.s.unacked, 16)), Consumer: consumer}).Result()
		if err != nil || len(pending) == 0 {
			return err
		}
		ids := make([]string, len(pending))
		for i, p := range pending {
			ids[i] = p.ID
		}
		// MinIdle again: of two members claiming at once, only the first gets an entry.
		xms, err := r.client.XClaim(ctx, &redis.XClaimArgs{Stream: r.topic, Group: r.s.group, Consumer: r.consumer,
			MinIdle: minIdle, Messages: ids}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		// A claim whose reply is lost leaves the entries under this consumer, idle no longer: go-redis
		// claims again on a new connection and gets nothing; takeBack finds them.
		if xms = r.hold(xms); len(xms) > 0 {
			r.s.logger.Info("Took over pending entries of a consumer that is gone", r.fields.Add(watermill.LogFields{
				"from": consumer, "entries": len(xms)}))
			select {
			case r.claimed <- xms:
			case <-ctx.Done():
				return nil
			}
		}
		if len(xms) < len(ids) || len(pending) < max(r.s.unacked, 16) {
			return nil
		}
	}
}

// takeBack hands out again the entries pending under this subscription's own consumer, idle for
// redisOwnIdle, that it does not hold. Redis counts an entry delivered when it sends the reply that
// holds it: a reply cut on its way (go-redis then sends the read again on a new connection, which
// finds nothing new, and reports no error) leaves its entries pending under a consumer that is
// alive, which nobody claims from, as does an acknowledgement given up. Entries held, however long
// they take, are left alone.
func (r *redisSubscription) takeBack(ctx context.Context) error {
	page := max(r.s.unacked, 100)
	for start := "-"; ; {
		pending, err := r.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.topic, Group: r.s.group,
			Idle: redisOwnIdle, Start: start, End: "+", Count: int64(page), Consumer: r.consumer}).Result()
		if err != nil || len(pending) == 0 {
			return err
		}
		var ids []string
		for _, p := range pending {
			if _, held := r.held.Load(p.ID); !held {
				ids = append(ids, p.ID)
			}
		}
		if len(ids) > 0 {
			// XCLAIM to this consumer returns the entries and counts the delivery. MinIdle again: an
			// entry another member claimed meanwhile (this consumer taken for gone) is idle no
			// longer, and stays where it is; one acknowledged meanwhile is not pending any more. An
			// entry whose reply was only slow and has arrived meanwhile is held already (hold).
			xms, err := r.client.XClaim(ctx, &redis.XClaimArgs{Stream: r.topic, Group: r.s.group, Consumer: r.consumer,
				MinIdle: redisOwnIdle, Messages: ids}).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			if xms = r.hold(xms); len(xms) > 0 {
				logs.Warn(r.s.logger, "Handing out again entries pending under this consumer that it does not hold "+
					"(a reply lost on its way, or an acknowledgement given up)", nil, r.fields.Add(watermill.LogFields{"entries": len(xms)}))
				select {
				case r.claimed <- xms:
				case <-ctx.Done():
					return nil
				}
			}
		}
		if len(pending) < page {
			return nil
		}
		start = "(" + pending[len(pending)-1].ID
	}
}
