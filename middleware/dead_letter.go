package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/dbtext"
	"github.com/outboxkit/outboxkit/internal/logs"
	"github.com/outboxkit/outboxkit/store"
)

// DefaultMaxDeliveries is how many deliveries a message gets before it is dead-lettered.
const DefaultMaxDeliveries = 5

// DeadLetterConfig configures NewDeadLetter.
type DeadLetterConfig struct {
	// Store holds dead_letters. Required.
	Store store.Store
	// Consumer names the consuming service. Required.
	Consumer string

	// MaxDeliveries is how many deliveries a message gets: it is dead-lettered when the handler
	// fails on the last one. A message that arrives more often than that, unprocessed, never
	// finished its earlier deliveries — but a process that dies takes every delivery it had in
	// flight with it, so the one that crashed it cannot be told from the others yet: the suspect
	// gets one more attempt, alone in the process (see SoloWait), recorded before it starts. If it
	// comes back from that attempt unfinished, it crashed the process by itself and is
	// dead-lettered before the handler runs; a crashing message is therefore dead-lettered on
	// delivery MaxDeliveries + 2, after MaxDeliveries + 1 attempts. It needs DeliveryCount further
	// out in the stack; without it only permanent errors dead-letter.
	// Default DefaultMaxDeliveries (5).
	MaxDeliveries int
	// SoloWait bounds how long a suspect (see MaxDeliveries) waits for the process's other
	// deliveries to end before its attempt alone — while it waits, the deliveries that arrive after
	// it wait behind it. Past SoloWait, it is not run but returned with an error, and tried again on
	// its redelivery, at most MaxSoloWaits times in a row. Default DefaultSoloWait (1 minute).
	SoloWait time.Duration
	// MaxSoloWaits bounds how many deliveries of a suspect in a row may wait SoloWait in vain: a
	// process that is never free of other deliveries for that long would otherwise redeliver it
	// forever, each of its deliveries holding back the process's new ones for up to SoloWait. The
	// delivery on which it waits in vain for the MaxSoloWaits-th time dead-letters it without
	// running it, with a reason that says it never got to run alone — nothing showed that it
	// crashes the process: replay it once the process is less busy, or raise SoloWait. The waits
	// are counted in inbox_deliveries under a key of their own ("solowait:" and the message id);
	// an attempt alone starts the count anew. Total hold-back per suspect: at most MaxSoloWaits ×
	// SoloWait. Default DefaultMaxSoloWaits (3).
	MaxSoloWaits int

	// DisableTable stops dead-lettered messages from being stored in the dead_letters table, from
	// which ReplayInboxDeadLetters re-publishes them. Default false: they are stored. At least one of
	// the table and a poison topic must be used.
	DisableTable bool

	// DeadLetterPublisher and DeadLetterTopic, when set, also send dead-lettered messages to a topic of their own
	// through Watermill's PoisonQueue middleware, with its metadata (reason_poisoned,
	// topic_poisoned, handler_poisoned, subscriber_poisoned). Default: no poison topic.
	DeadLetterPublisher message.Publisher
	DeadLetterTopic     string

	// IsUnreachable recognises failures to reach a dependency: they are never dead-lettered, not
	// even on the last allowed delivery, since the message is not at fault. Default
	// IsUnreachableIn(Store).
	IsUnreachable func(error) bool

	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives one line per dead-lettered message. Default: slog.Default(), WARN and above.
	Logger watermill.LoggerAdapter
}

func (c DeadLetterConfig) withDefaults() DeadLetterConfig {
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = DefaultMaxDeliveries
	}
	if c.SoloWait == 0 {
		c.SoloWait = DefaultSoloWait
	}
	if c.MaxSoloWaits == 0 {
		c.MaxSoloWaits = DefaultMaxSoloWaits
	}
	if c.IsUnreachable == nil {
		c.IsUnreachable = IsUnreachableIn(c.Store)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logs.Default()
	}
	return c
}

func (c DeadLetterConfig) validate() error {
	errs := requireStoreAndConsumer(c.Store, c.Consumer)
	if c.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("field MaxDeliveries must be at least 1, got %d", c.MaxDeliveries))
	}
	if c.SoloWait < 0 {
		errs = append(errs, fmt.Errorf("field SoloWait must not be negative, got %s", c.SoloWait))
	}
	if c.MaxSoloWaits < 1 {
		errs = append(errs, fmt.Errorf("field MaxSoloWaits must be at least 1, got %d", c.MaxSoloWaits))
	}
	if (c.DeadLetterPublisher == nil) != (c.DeadLetterTopic == "") {
		errs = append(errs, errors.New("fields DeadLetterPublisher and DeadLetterTopic go together: set both or neither"))
	}
	if c.DisableTable && c.DeadLetterPublisher == nil {
		errs = append(errs, errors.New("field DisableTable leaves dead-lettered messages nowhere: set DeadLetterPublisher and DeadLetterTopic"))
	}
	return errors.Join(errs...)
}

// dead-lettered carries a message from our middleware to Watermill's PoisonQueue.
type deadLettered struct{ reason string }

func (q *deadLettered) Error() string { return "dead-lettered: " + q.reason }

// NewDeadLetter dead-letters a message that cannot be processed — one the handler failed with a
// permanent error, failed on its last allowed delivery, or that crashed the process (it never
// finished within MaxDeliveries, nor its one attempt alone in the process after them), or one that
// never got to make that attempt (MaxSoloWaits) — and acknowledges it, so the queue keeps flowing
// behind it. A message delivered more often than MaxDeliveries that was in fact processed
// (duplicates) is acknowledged as a duplicate instead.
// Other errors are returned, so the message is retried. If storing or sending the dead-lettered
// message fails, the message is not acknowledged: nothing is ever dropped.
func NewDeadLetter(cfg DeadLetterConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("dead letter config: %w", err)
	}
	dl := &deadLetter{cfg: cfg}
	deadLetter := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return dl.handle(h, msg) }
	}
	if cfg.DeadLetterPublisher == nil {
		return deadLetter, nil
	}
	poison, err := wmiddleware.PoisonQueueWithFilter(cfg.DeadLetterPublisher, cfg.DeadLetterTopic, func(err error) bool {
		var q *deadLettered
		return errors.As(err, &q)
	})
	if err != nil {
		return nil, fmt.Errorf("dead letter config: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc { return poison(deadLetter(h)) }, nil
}

type deadLetter struct{ cfg DeadLetterConfig }

func (dl *deadLetter) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	d := deliveryOf(msg)
	if d.count > dl.cfg.MaxDeliveries && msg.UUID != "" {
		// Every delivery counts, duplicates too, so a message processed long ago can exceed
		// MaxDeliveries as well: Processed tells a crash loop from duplicates, exactly.
		done, err := d.session(dl.cfg.Store).Processed(msg.Context(), dl.cfg.Consumer, msg.UUID, dl.cfg.Now())
		if err != nil {
			return nil, fmt.Errorf("check whether message %s was processed: %w", msg.UUID, err)
		}
		if done {
			d.duplicate = true
			return nil, nil
		}
		return dl.alone(h, msg, d)
	}
	out, err := dl.beside(h, msg)
	if errors.Is(err, errGateNotTaken) {
		return nil, err
	}
	return dl.settle(msg, d, out, err)
}

// errGateNotTaken: the delivery ended while it waited for a suspect running alone; the handler did
// not run.
var errGateNotTaken = errors.New("the delivery ended while it waited for a message running alone in the process")

// beside runs the handler with the process's other deliveries, not beside a suspect running alone.
// The gate is released even if the handler panics (a recoverer further out may keep the process).
func (dl *deadLetter) beside(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	hold, err := holdShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errGateNotTaken, err)
	}
	defer hold.release()
	msg.SetContext(hold.bind(ctx)) // a delivery the handler runs inside this one shares its hold
	defer msg.SetContext(ctx)
	return h(msg)
}

// alone runs a suspect — a message delivered more than MaxDeliveries times without finishing —
// with no other delivery of the process running, after recording that it started: every earlier
// delivery may have died with a process another message crashed, but if this one does not finish
// either, the crash was its own.
func (dl *deadLetter) alone(h message.HandlerFunc, msg *message.Message, d *delivery) ([]*message.Message, error) {
	ctx := msg.Context()
	wait, cancel := context.WithTimeout(ctx, dl.cfg.SoloWait)
	hold, err := holdAlone(wait)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return dl.waitedInVain(msg, d)
	}
	defer hold.release()
	msg.SetContext(hold.bind(ctx))
	defer msg.SetContext(ctx)
	key := soloKey(msg.UUID)
	if !d.soloStarted {
		if d.soloWaits > 0 || d.count > dl.cfg.MaxDeliveries+1 {
			// It gets its attempt alone at last: the waits in vain before it no longer count. (A
			// suspect on its first delivery past MaxDeliveries has not waited before.)
			dl.forget(ctx, msg.UUID, soloWaitKey, "Cannot remove the count of a message's waits to run alone")
			d.soloWaits = 0
		}
		// Committed before the handler runs, as the delivery count is: a crash leaves it behind.
		marker, attempts, err := dl.cfg.Store.LockMessage(ctx, dl.cfg.Consumer, key, store.Count{Now: dl.cfg.Now(), First: 1})
		if err != nil {
			return nil, fmt.Errorf("record the attempt alone of message %s: %w", msg.UUID, err)
		}
		marker.Unlock(ctx)
		if attempts > 1 {
			err := dl.deadLetter(msg, d, fmt.Sprintf(
				"delivered %d times without finishing (at most %d allowed), the last attempt alone in the process: "+
					"the handler crashes the process", d.count, dl.cfg.MaxDeliveries))
			if d.deadLettered {
				dl.forgetAlone(ctx, msg.UUID)
			}
			return nil, err
		}
		d.soloStarted = true // an in-process retry of this delivery is the same attempt
	}
	out, err := h(msg)
	// It finished: whatever comes next, it did not crash the process.
	d.soloStarted = !dl.forgetAlone(ctx, msg.UUID)
	return dl.settle(msg, d, out, err)
}

// waitedInVain ends a delivery of a suspect that could not run alone within SoloWait: it counts
// the wait, and dead-letters the suspect once it has waited in vain MaxSoloWaits times in a row;
// until then the delivery fails without running, to be tried again on its redelivery.
func (dl *deadLetter) waitedInVain(msg *message.Message, d *delivery) ([]*message.Message, error) {
	ctx := msg.Context()
	if d.soloWaits == 0 { // an in-process retry of this delivery is the same wait
		// Committed, as the attempt alone is, so that the count outlives the process.
		marker, waits, err := dl.cfg.Store.LockMessage(ctx, dl.cfg.Consumer, soloWaitKey(msg.UUID),
			store.Count{Now: dl.cfg.Now(), First: 1})
		if err != nil {
			return nil, fmt.Errorf("message %s could not run alone in the process within %s, and that cannot be counted: %w",
				msg.UUID, dl.cfg.SoloWait, err)
		}
		marker.Unlock(ctx)
		d.soloWaits = waits
	}
	if d.soloWaits < dl.cfg.MaxSoloWaits {
		return nil, fmt.Errorf("message %s, delivered %d times without finishing, was to run alone in the process "+
			"to tell whether it crashes it, but other deliveries still ran after %s (%d of %d such waits before it is "+
			"dead-lettered); it is tried again on its redelivery",
			msg.UUID, d.count, dl.cfg.SoloWait, d.soloWaits, dl.cfg.MaxSoloWaits)
	}
	err := dl.deadLetter(msg, d, fmt.Sprintf(
		"delivered %d times without finishing (at most %d allowed), and never got to run alone in the process to tell "+
			"whether it crashes it: other deliveries still ran after %s, on %d deliveries in a row (MaxSoloWaits); "+
			"it was not run — replay it when the process is less busy", d.count, dl.cfg.MaxDeliveries, dl.cfg.SoloWait, d.soloWaits))
	if d.deadLettered {
		dl.forget(ctx, msg.UUID, soloWaitKey, "Cannot remove the count of a message's waits to run alone")
	}
	return nil, err
}

// forgetAlone removes the record of a suspect's attempt alone. Left behind, it would dead-letter
// the message at its next suspicion without another attempt; a replay removes it too.
func (dl *deadLetter) forgetAlone(ctx context.Context, messageID string) bool {
	return dl.forget(ctx, messageID, soloKey, "Cannot remove the record of a message's attempt alone")
}

// forget removes the delivery-count row that key gives for the message, and logs failure if it
// cannot.
func (dl *deadLetter) forget(ctx context.Context, messageID string, key func(string) string, failure string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := dl.cfg.Store.ResetDeliveries(ctx, dl.cfg.Consumer, key(messageID)); err != nil {
		dl.cfg.Logger.Error(failure, err, watermill.LogFields{"consumer": dl.cfg.Consumer, "message_uuid": messageID})
		return false
	}
	return true
}

// settle dead-letters what the handler's outcome calls for, and returns the rest.
func (dl *deadLetter) settle(msg *message.Message, d *delivery, out []*message.Message, err error) ([]*message.Message, error) {
	switch {
	case err == nil:
		return out, nil
	case held(dl.cfg.IsUnreachable, err) && !handlers.IsPermanent(err):
		return out, err // not the message's fault: the circuit waits for the dependency, or the fix
	case handlers.IsPermanent(err):
		return nil, dl.deadLetter(msg, d, err.Error())
	case d.count >= dl.cfg.MaxDeliveries:
		return nil, dl.deadLetter(msg, d, fmt.Sprintf("failed on delivery %d of %d: %v", d.count, dl.cfg.MaxDeliveries, err))
	}
	return out, err
}

func (dl *deadLetter) deadLetter(msg *message.Message, d *delivery, reason string) error {
	reason = dbtext.Storable(reason)
	// A message is dead-lettered on a delivery, so it had one at least, even uncounted (a message
	// without an id, which nothing can count, or a stack without DeliveryCount).
	deliveries := max(d.count, 1)
	if !dl.cfg.DisableTable {
		metadata, err := json.Marshal(msg.Metadata)
		if err != nil || msg.Metadata == nil {
			metadata = []byte("{}")
		}
		if err := d.session(dl.cfg.Store).DeadLetter(msg.Context(), store.InboxDeadLetter{
			Consumer: dl.cfg.Consumer, Topic: subscribeTopic(msg.Context()), MessageID: deadLetterID(msg, metadata),
			Payload: msg.Payload, Metadata: metadata, Reason: reason, Deliveries: deliveries, Now: dl.cfg.Now(),
		}); err != nil {
			return fmt.Errorf("dead-letter message %s (%s): %w", msg.UUID, reason, err)
		}
	}
	d.deadLettered = true
	logs.Warn(dl.cfg.Logger, "Message dead-lettered: it waits for an operator's replay", nil, watermill.LogFields{
		"consumer": dl.cfg.Consumer, "message_uuid": msg.UUID, "deliveries": deliveries, "reason": reason,
	})
	if dl.cfg.DeadLetterPublisher != nil {
		return &deadLettered{reason: reason}
	}
	return nil
}

// deadLetterID is the id a message is dead-lettered under: its own, or, for a message that came
// without one, "no-id:" and a digest of its topic, payload and metadata — dead letters are kept one
// per id, and distinct messages without an id must not overwrite one another.
func deadLetterID(msg *message.Message, metadata []byte) string {
	if msg.UUID != "" {
		return msg.UUID
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(subscribeTopic(msg.Context())), msg.Payload, metadata} {
		_, _ = fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return "no-id:" + hex.EncodeToString(h.Sum(nil)[:16])
}
