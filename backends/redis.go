package backends

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit"
)

func openRedis(ctx context.Context, rawURL string, opts Options) (*Backend, error) {
	if opts.ClaimAfter == 0 {
		opts.ClaimAfter = 30 * time.Second
	}
	ropts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	client := redis.NewClient(ropts)
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, opts.Logger)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &Backend{
		Publisher: classifyingPublisher{Publisher: pub, classify: classifyRedis},
		Features:  Features{PerKeyOrder: "queue", Persistent: true, ConsumerGroups: true},
		newSubscriber: func(group string) (message.Subscriber, error) {
			return redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client: redis.NewClient(ropts), ConsumerGroup: group,
				Consumer:      group + "-" + uuid.NewString()[:8], // one name per process, so a dead one's messages can be claimed
				MaxIdleTime:   opts.ClaimAfter,                    // pending that long with a silent consumer: claimed by another
				ClaimInterval: opts.ClaimAfter / 3,
				OldestId:      "0", // a new group reads the stream from its start
			}, opts.Logger)
		},
		closers: []func() error{pub.Close, client.Close},
	}, nil
}

func classifyRedis(err error) error {
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) || outboxkit.IsTransport(err) {
		return outboxkit.Transport(err)
	}
	return err
}
