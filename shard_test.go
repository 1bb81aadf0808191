package outboxkit_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/outboxkit/outboxkit"
)

func TestShardTopic(t *testing.T) {
	shards := outboxkit.ShardTopics("orders", 4)
	count := map[string]int{}
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("order-%d", i)
		s := outboxkit.ShardTopic("orders", key, 4)
		if !slices.Contains(shards, s) {
			t.Fatalf("key %s went to %s, not one of %v", key, s, shards)
		}
		if again := outboxkit.ShardTopic("orders", key, 4); again != s {
			t.Fatalf("key %s moved from %s to %s", key, s, again)
		}
		count[s]++
	}
	for _, s := range shards {
		if count[s] < 150 {
			t.Fatalf("shard %s got %d of 1000 keys: the hash does not spread them (%v)", s, count[s], count)
		}
	}
	if outboxkit.ShardTopic("orders", "k", 1) != "orders" || len(outboxkit.ShardTopics("orders", 1)) != 1 {
		t.Fatal("one shard must be the topic itself")
	}
}
