package fleet

import (
	"context"
	"errors"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
)

// errFenced is what an owner's publisher answers once its lease may have expired: the forwarder
// takes it for an unreachable broker, so the rows wait for the next owner and burn no attempt.
var errFenced = outboxkit.Unreachable(errors.New("fleet: the lease on this outbox may have expired; its owner stopped publishing"))

// stamper is an outbox's publisher for one lease: it publishes through the fleet's publisher a
// copy of each message stamped with the outbox's tenant, name, fencing token and owner, and
// refuses to publish once allowed says the lease may have expired.
type stamper struct {
	pub     message.Publisher
	allowed func() bool
	stamps  [4][2]string
}

func newStamper(pub message.Publisher, o Outbox, token int64, member string, allowed func() bool) message.Publisher {
	s := &stamper{pub: pub, allowed: allowed, stamps: [4][2]string{
		{outboxkit.MetadataTenant, o.Tenant},
		{outboxkit.MetadataOutbox, o.Name},
		{outboxkit.MetadataLeaseToken, strconv.FormatInt(token, 10)},
		{outboxkit.MetadataRelayMember, member},
	}}
	// The forwarder watches an unreachable broker through its publisher's Check: keep it where
	// the fleet's publisher has one, and only there.
	if c, ok := pub.(checker); ok {
		return checkingStamper{stamper: s, c: c}
	}
	return s
}

// Publish publishes stamped copies of msgs: the forwarder's messages are its own, but a copy keeps
// the stamps off anything the caller holds.
func (s *stamper) Publish(topic string, msgs ...*message.Message) error {
	if !s.allowed() {
		return errFenced
	}
	out := make([]*message.Message, len(msgs))
	for i, msg := range msgs {
		c := msg.CopyWithContext()
		for _, kv := range s.stamps {
			c.Metadata.Set(kv[0], kv[1])
		}
		out[i] = c
	}
	return s.pub.Publish(topic, out...)
}

// Close does nothing: the fleet's publisher is shared by every outbox, and closed by its owner.
func (*stamper) Close() error { return nil }

// checker is a publisher that can tell whether the broker accepts it (the backends' publishers).
type checker interface {
	Check(ctx context.Context) error
}

type checkingStamper struct {
	*stamper
	c checker
}

func (s checkingStamper) Check(ctx context.Context) error { return s.c.Check(ctx) }
