// Package redisbackend is outboxkit's Redis Streams broker: a stream per topic, a consumer group
// per consumer group, pending entries of a dead consumer taken over by a live one within seconds. It registers
// redis:// and rediss:// with backends.Open.
package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

func open(ctx context.Context, rawURL string, opts backends.Options) (backends.Parts, error) {
	if opts.ClaimAfter == 0 {
		opts.ClaimAfter = 30 * time.Second
	}
	ropts, err := redis.ParseURL(rawURL)
	if err != nil {
		return backends.Parts{}, err
	}
	boundPool(ropts, rawURL)
	newClient := clients(ropts)
	client := newClient() // connects on first use
	marshaller := redisMarshaller{wire: brokerio.NewWire(opts)}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client, Marshaller: marshaller}, opts.Logger)
	if err != nil {
		_ = client.Close()
		return backends.Parts{}, err
	}
	return backends.Parts{
		Publisher: brokerio.ClassifyingPublisher{Publisher: pub, Classify: classifyRedis,
			Ping: func(ctx context.Context) error { return client.Ping(ctx).Err() }},
		Lag: redisLag(client),
		NewSubscriber: func(group string) (backends.Subscriber, error) {
			sub := newRedisSubscriber(newClient, group, opts.Unacked, opts.ClaimAfter, marshaller, opts.Logger)
			return brokerio.NewRetryingSubscriber(sub, group, classifyRedis, opts.Logger), nil
		},
		Close: []func() error{pub.Close}, // it closes client: closed twice, Close failed with "redis: client is closed"
	}, nil
}

// clients makes clients with opts, each from a copy of its own: redis.NewClient fills in the
// defaults in the options it is given, and a -1 ("none", as in max_retries=-1 in the URL) becomes
// 0 there, which the next client would take for "unset" and the default.
func clients(opts *redis.Options) func() *redis.Client {
	base := *opts
	return func() *redis.Client {
		o := base
		return redis.NewClient(&o)
	}
}

func classifyRedis(err error) error {
	if err != nil {
		if msg := err.Error(); strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOPERM") {
			return outboxkit.AccessDenied(err)
		}
	}
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) || outboxkit.IsUnreachable(err) {
		return outboxkit.Unreachable(err)
	}
	return err
}

// redisMarshaller is watermill-redisstream's format with ce_* fields when CloudEvents is on, and
// able to read an entry another producer wrote: without Watermill's UUID field, the entry's ce_id
// is the UUID and its payload the "payload" or "data" field.
type redisMarshaller struct {
	redisstream.DefaultMarshallerUnmarshaller
	wire brokerio.Wire
}

func (m redisMarshaller) Marshal(topic string, msg *message.Message) (map[string]interface{}, error) {
	values, err := m.DefaultMarshallerUnmarshaller.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	for name, v := range m.wire.CEAttributes(topic, msg) {
		values[brokerio.CEPrefixOther+name] = v
	}
	return values, nil
}

func (m redisMarshaller) Unmarshal(values map[string]interface{}) (*message.Message, error) {
	field := func(name string) string {
		if v, ok := values[name].(string); ok {
			return v
		}
		return ""
	}
	attrs := func(name string) string { return field(brokerio.CEPrefixOther + name) }
	if values[redisstream.UUIDHeaderKey] != nil {
		msg, err := m.DefaultMarshallerUnmarshaller.Unmarshal(values)
		if err == nil {
			brokerio.AdoptForeign(msg, attrs)
		}
		return msg, err
	}
	payload := field("payload")
	if _, ok := values["payload"]; !ok {
		payload = field("data")
	}
	msg := message.NewMessage("", []byte(payload))
	brokerio.AdoptForeign(msg, attrs)
	if msg.UUID == "" {
		return nil, fmt.Errorf("stream entry has neither %s nor ce_id: it cannot be deduplicated", redisstream.UUIDHeaderKey)
	}
	return msg, nil
}

func init() {
	backends.Register(open, "redis://host:6379/0 (Redis Streams)", "redis", "rediss")
}
