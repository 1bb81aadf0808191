package redisbackend

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// redisLag reads XINFO GROUPS (the group's lag and pending entries) and the ids of the oldest
// entry not acknowledged, which are its time in milliseconds.
func redisLag(client *redis.Client) func(ctx context.Context, topic, group string) (backends.Lag, error) {
	return func(ctx context.Context, topic, group string) (backends.Lag, error) {
		groups, err := client.XInfoGroups(ctx, topic).Result()
		if err != nil {
			return backends.Lag{}, classifyRedis(err)
		}
		for _, g := range groups {
			if g.Name != group {
				continue
			}
			l := backends.Lag{Waiting: max(g.Lag, 0), Unacked: g.Pending, HasUnacked: true}
			oldest := ""
			if g.Pending > 0 {
				if p, err := client.XPending(ctx, topic, group).Result(); err == nil {
					oldest = p.Lower
				}
			} else if g.Lag > 0 {
				if next, err := client.XRangeN(ctx, topic, "("+g.LastDeliveredID, "+", 1).Result(); err == nil && len(next) == 1 {
					oldest = next[0].ID
				}
			}
			if ms, _, ok := strings.Cut(oldest, "-"); ok {
				if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
					l.OldestAge, l.HasAge = brokerio.AgeOf(time.UnixMilli(n)), true
				}
			}
			return l, nil
		}
		return backends.Lag{}, fmt.Errorf("no consumer group %s on stream %s (has the group subscribed yet?)", group, topic)
	}
}
