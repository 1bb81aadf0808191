package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// ReplayConfig configures ReplayInboxDeadLetters.
type ReplayConfig struct {
	// Store holds dead_letters. Required.
	Store store.Store
	// Publisher sends the messages back to their topics, typically the broker publisher the
	// forwarder uses. Required.
	Publisher message.Publisher
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// ReplayInboxDeadLetters re-publishes the selected consumers' dead letters to the topics they came
// from, with their UUIDs, payloads and metadata unchanged but for a replay token
// (outboxkit.MetadataReplay, which keeps brokers that deduplicate publishes from dropping the
// replay), and returns them. Each one's delivery count is reset first, so that it gets its full
// MaxDeliveries again. A consumer that processed the message meanwhile (or another consumer of the
// topic that already had it) absorbs the replay in its inbox as a duplicate. Replay stops at the
// first message that cannot be published; those already sent are marked replayed. An empty filter
// replays nothing unless All is set.
func ReplayInboxDeadLetters(ctx context.Context, cfg ReplayConfig, filter store.DeadLetterFilter) ([]store.DeadLetter, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, errors.New("field Store is required"))
	}
	if cfg.Publisher == nil {
		errs = append(errs, errors.New("field Publisher is required to send the messages back"))
	}
	if filter.Empty() && !filter.All {
		errs = append(errs, store.ErrEmptyFilter)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("replay dead letters: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	filter.Limit = -1
	letters, err := cfg.Store.InboxDeadLetters(ctx, filter)
	if err != nil {
		return nil, err
	}
	for i, d := range letters {
		if err := cfg.Store.ResetDeliveries(ctx, d.Consumer, d.MessageID); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d: reset its deliveries: %w", d.ID, err)
		}
		if err := cfg.Store.ResetDeliveries(ctx, d.Consumer, soloKey(d.MessageID)); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d: reset its attempt alone: %w", d.ID, err)
		}
		if err := cfg.Store.ResetDeliveries(ctx, d.Consumer, soloWaitKey(d.MessageID)); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d: reset its waits to run alone: %w", d.ID, err)
		}
		msg := message.NewMessage(d.MessageID, d.Payload)
		msg.Metadata = message.Metadata(d.Metadata)
		if msg.Metadata == nil {
			msg.Metadata = message.Metadata{}
		}
		msg.Metadata.Set(outboxkit.MetadataReplay, fmt.Sprintf("%d.%d", d.ID, cfg.Now().UnixNano()))
		msg.SetContext(ctx)
		if err := cfg.Publisher.Publish(d.Topic, msg); err != nil {
			return letters[:i], fmt.Errorf("replay dead letter %d (message %s) to %s: %w", d.ID, d.MessageID, d.Topic, err)
		}
		if err := cfg.Store.MarkReplayed(ctx, d.ID, cfg.Now()); err != nil {
			return letters[:i+1], fmt.Errorf("replay dead letter %d: published, but not marked replayed: %w", d.ID, err)
		}
	}
	return letters, nil
}
