package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (t inboxTx) LockVersion(ctx context.Context, consumer, key string) (int64, bool, error) {
	if _, err := t.tx.Exec(ctx, t.s.q.VersionPlaceholder, consumer, key, t.s.d.Time(time.Now())); err != nil {
		return 0, false, t.s.d.Classify(err)
	}
	var v int64
	found, err := dbexec.FirstOf(ctx, t.tx, t.s.q.LockVersion, []any{consumer, key}, &v)
	return v, found && v > 0, t.s.d.Classify(err) // version 0 is the placeholder of a key never applied
}

func (t inboxTx) ParkMessage(ctx context.Context, p store.Parked) error {
	_, err := t.tx.Exec(ctx, t.s.q.ParkMessage, p.Consumer, p.Key, p.Version, p.MessageID, p.Topic, p.Payload, string(p.Metadata),
		t.s.d.Time(p.ParkedAt))
	return t.s.d.Classify(err)
}

func (t inboxTx) TakeParked(ctx context.Context, consumer, key string, version int64) (store.Parked, bool, error) {
	p := store.Parked{Consumer: consumer, Key: key, Version: version}
	var metadata string
	var parkedAt any
	found, err := dbexec.FirstOf(ctx, t.tx, t.s.q.TakeParked, []any{consumer, key, version},
		&p.MessageID, &p.Topic, &p.Payload, &metadata, &parkedAt)
	if err != nil || !found {
		return p, false, t.s.d.Classify(err)
	}
	p.Metadata = []byte(metadata)
	if p.Payload == nil {
		p.Payload = []byte{}
	}
	if t.s.q.DeleteParked != "" {
		if _, err := t.tx.Exec(ctx, t.s.q.DeleteParked, consumer, key, version); err != nil {
			return p, false, t.s.d.Classify(err)
		}
	}
	return p, true, nil
}

func (t inboxTx) DeadLetterParked(ctx context.Context, q store.InboxDeadLetter) error {
	if err := t.s.insertDeadLetter(ctx, t.tx, q); err != nil {
		return fmt.Errorf("dead-letter parked message %s: %w", q.MessageID, t.s.d.Classify(err))
	}
	_, err := t.tx.Exec(ctx, t.s.q.ForgetInbox, q.Consumer, q.MessageID)
	return t.s.d.Classify(err)
}

// savepoint is the one the order guard sets before it applies a parked message.
const savepoint = "outboxkit_parked"

func (t inboxTx) Savepoint(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, "SAVEPOINT "+savepoint)
	return t.s.d.Classify(err)
}

func (t inboxTx) RollbackToSavepoint(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint)
	return t.s.d.Classify(err)
}

func (t inboxTx) StoreVersion(ctx context.Context, consumer, key string, version int64, now time.Time) error {
	_, err := t.tx.Exec(ctx, t.s.q.StoreVersion, consumer, key, version, t.s.d.Time(now))
	return t.s.d.Classify(err)
}
