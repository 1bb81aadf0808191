package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// Redis Streams: one subscriber reading many topics starts at once and keeps every subscription
// alive. Each subscription holds a connection in its blocking read and uses up to three more
// (liveness key, claims, acks); sharing one bounded pool of 10, 60 subscriptions took 87 s to
// start, every Subscribe waiting on the pool behind the others' reads.
func TestRedis_OneSubscriberOfManyTopicsStaysAlive(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	const n = 60 // many more subscriptions than a client's pool holds connections (10)
	group := testenv.UniqueName(t, "many")
	topics := make([]string, n)
	for i := range topics {
		topics[i] = fmt.Sprintf("%s-%d", group, i)
	}
	dropWhenDone(t, "redis", url, topics, nil)
	b := openBackend(t, url, backends.Options{})
	sub, err := b.NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = sub.Close() })
	began := time.Now()
	for _, topic := range topics {
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				m.Ack()
			}
		}()
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("subscribing to %d topics took %s: the subscriptions wait on one another's connections", n, took.Round(time.Millisecond))
	} else {
		t.Logf("subscribed to %d topics in %s", n, took.Round(time.Millisecond))
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	// Watch the liveness keys for twice their life: every subscription's key must stay.
	deadline := time.Now().Add(6 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond) // the watch's sampling period
	defer tick.Stop()
	var fewest = n
	for ; time.Now().Before(deadline); <-tick.C {
		keys, err := client.Keys(ctx, "outboxkit:alive:"+group+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		fewest = min(fewest, len(keys))
	}
	if fewest < n {
		t.Fatalf("%d subscriptions of one subscriber: at times only %d liveness keys existed — live consumers taken for gone", n, fewest)
	}
}
