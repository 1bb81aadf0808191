package middleware

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/store"
)

// delivery is what the middlewares learn about one delivery of a message, shared through the
// message context from the outermost middleware inward.
type delivery struct {
	// msg is the message delivered: one handled inside another's handler, with a context derived
	// from the other's, is a delivery of its own.
	msg          *message.Message
	count        int  // persistent delivery count; 0 when DeliveryCount is not in the stack
	counted      bool // DeliveryCount has counted this delivery (in-process retries do not count again)
	duplicate    bool
	deadLettered bool
	parked       bool // the order guard parked it: it waits for an earlier event of its key
	soloStarted  bool // its attempt alone in the process is recorded (see DeadLetterConfig.MaxDeliveries)
	soloWaits    int  // its waits in vain to run alone, this one's included, once counted (see DeadLetterConfig.MaxSoloWaits)

	// locked is the session DeliveryCount holds for the whole delivery, with the message's lock:
	// the middlewares inside do their database work on it, so a delivery needs one connection
	// however many steps it takes, and no two deliveries of a message overlap.
	locked store.LockedSession
	// inbox is the inbox's transaction while the handler runs, for the order guard.
	inbox store.InboxTx
	// consumer and message are what the inbox applies the delivery as, for OutboundKey.
	consumer, message string
}

// session returns the delivery's locked session when DeliveryCount holds one, else the store's.
func (d *delivery) session(s store.Store) store.Session {
	if d.locked != nil {
		return d.locked
	}
	return s.Session()
}

type deliveryKey struct{}

// deliveryOf returns the message's delivery record, attaching one when there is none yet.
func deliveryOf(msg *message.Message) *delivery {
	if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok && d.msg == msg {
		return d
	}
	d := &delivery{msg: msg}
	msg.SetContext(context.WithValue(msg.Context(), deliveryKey{}, d))
	return d
}

// Deliveries returns how many times the message being handled has been delivered to this consumer,
// this delivery included, as counted by DeliveryCount; 0 without it.
func Deliveries(ctx context.Context) int {
	if d, ok := ctx.Value(deliveryKey{}).(*delivery); ok {
		return d.count
	}
	return 0
}

// OutboundKey is the idempotency key for an effect outside the database that the handler being
// run causes (outboxkit.OutboundKey of the consumer and the message UUID): send it with the call
// (an HTTP Idempotency-Key header), so that the other side applies the call once however often the
// message is delivered. ok is false outside an inbox (the handler does not run in a consumer
// stack or batch consumer).
func OutboundKey(ctx context.Context) (key string, ok bool) {
	d, ok := ctx.Value(deliveryKey{}).(*delivery)
	if !ok || d.consumer == "" {
		return "", false
	}
	return outboxkit.OutboundKey(d.consumer, d.message), true
}

var consumerName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)

// requireStoreAndConsumer validates what every database-backed middleware needs.
func requireStoreAndConsumer(s store.Store, consumer string) []error {
	var errs []error
	if s == nil {
		errs = append(errs, errors.New("field Store is required: pass the store of the database holding the inbox "+
			"(store/pgxstore, pgsqlstore, mysqlstore, sqlitestore, or store.Open)"))
	}
	if err := validConsumer(consumer); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func validConsumer(name string) error {
	if !consumerName.MatchString(name) {
		return fmt.Errorf("field Consumer %q: name the consuming service (letters, digits, '.', '_', ':', '-', "+
			"at most 100 characters), e.g. \"shipping\"; it keys the inbox, so it must not change", name)
	}
	return nil
}

// errNoUUID rejects messages the inbox cannot deduplicate; the inbox marks it permanent.
var errNoUUID = errors.New("message has no UUID: outboxkit deduplicates on it; publish through the outbox, " +
	"or give every message a unique UUID (RabbitMQ's message_id and a CloudEvents id serve too)")

// errUndecodable rejects a message its subscriber could not read (outboxkit.MetadataUndecodable
// says why); the inbox marks it permanent.
var errUndecodable = errors.New("it is kept as it came from the broker: fix its producer, then replay or archive it")

// ErrWrongConsumer is returned (wrapped) for a message that a subscriber delivered for another
// consumer than the one the stack was built for: the subscription's consumer name and
// StackConfig.Consumer must be the same, or the inbox would record the message under a name no
// subscription reads for.
var ErrWrongConsumer = errors.New("the message was delivered to another consumer than the stack's")

// misconfigured reports whether err says the consumer itself is set up wrong, whatever the
// message: a handler written for another transaction type than the store's, a stack built for
// another consumer than its subscription's, outboxkit's tables missing or migrated by a newer
// build, credentials or permissions a dependency refuses. Like an unreachable dependency it holds the message and counts nothing, until the program
// or the database is fixed; nothing is dead-lettered for it.
func misconfigured(err error) bool {
	var tte *outboxkit.TxTypeError
	return errors.As(err, &tte) || errors.Is(err, ErrWrongConsumer) || errors.Is(err, store.ErrNotMigrated) ||
		errors.Is(err, store.ErrNewerSchema) || outboxkit.IsAccessDenied(err)
}

// held reports whether a failure holds the message rather than counting against it: a dependency
// could not be reached, or the consumer is misconfigured.
func held(isUnreachable func(error) bool, err error) bool {
	return err != nil && (isUnreachable(err) || misconfigured(err))
}

// checkConsumer refuses a message that a subscriber stamped with another consumer's name.
func checkConsumer(msg *message.Message, consumer string) error {
	if got, ok := outboxkit.ConsumerFrom(msg.Context()); ok && got != consumer {
		return fmt.Errorf("consumer %q: %w: its subscription is for consumer %q; give the subscriber and StackConfig.Consumer "+
			"the same name (middleware.AddConsumerHandler refuses such a pair when the program starts)", consumer, ErrWrongConsumer, got)
	}
	return nil
}
