package outboxkit

import (
	"hash/fnv"
	"strconv"
)

// ShardTopic returns the shard of topic that partitionKey belongs to, "<topic>.<n>" for n in
// [0, shards), by a stable hash of the key. A forwarder whose TopicMapping uses it spreads a topic
// over shards; a consumer subscribing to every shard (ShardTopics) handles them in parallel while
// each key's messages stay in one shard, in order. Messages without a key go to shard 0.
func ShardTopic(topic, partitionKey string, shards int) string {
	if shards <= 1 {
		return topic
	}
	n := 0
	if partitionKey != "" {
		h := fnv.New32a()
		_, _ = h.Write([]byte(partitionKey))
		n = int(h.Sum32() % uint32(shards))
	}
	return topic + "." + strconv.Itoa(n)
}

// ShardTopics lists the shard topics of topic, for the consumer to subscribe to each.
func ShardTopics(topic string, shards int) []string {
	if shards <= 1 {
		return []string{topic}
	}
	out := make([]string, shards)
	for i := range out {
		out[i] = topic + "." + strconv.Itoa(i)
	}
	return out
}
