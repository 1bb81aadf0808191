package pglog

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/internal/pgsql"
	"github.com/outboxkit/outboxkit/store"
)

// deadLetterState is the dead letters the dispatcher owes the table.
type deadLetterState struct {
	bad     []*entry  // messages that do not decode, to dead-letter
	pending []deadRow // dead letters, written with the next checkpoint
}

// deadLetterBad dead-letters the messages that do not decode: they are kept for an operator, and
// the slot moves past them.
func (d *dispatcher) deadLetterBad(ctx context.Context) error {
	for len(d.dead.bad) > 0 {
		e := d.dead.bad[0]
		e.row.UUID = uuid.NewString()
		e.row.Topic = "outboxkit.undecodable"
		d.deadLetter(e, fmt.Sprintf("a logical decoding message with the outbox's prefix at %s does not decode: %v", e.lsn, e.bad))
		d.s.r.log.Error("Undecodable outbox message dead-lettered", e.bad, d.s.r.fields.Add(watermill.LogFields{"lsn": e.lsn.String()}))
		e.row.Payload = nil
		d.dead.bad = d.dead.bad[1:]
	}
	return nil
}

// deadRow is a dead letter to write with the next checkpoint.
type deadRow struct {
	row     store.OutboxRow
	delKey  string // the outbox row's uuid; "" for an event of the log, written as a row
	xid     uint32 // the row's writer, see flush
	errText string
	at      time.Time
}

// deadLetter parks an event the broker keeps refusing, in the outbox, for an operator: it is
// written in the transaction of the next checkpoint, which is the first to move past it — so the
// slot never moves past a dead letter that was not written.
func (d *dispatcher) deadLetter(e *entry, errText string) {
	d.dead.pending = append(d.dead.pending, deadRow{row: e.row, delKey: e.delKey, xid: e.xid, errText: errText, at: d.s.r.fcfg.Now()})
}

// writeDeadLetter writes dl in tx: an outbox row is marked, an event of the log is written as a
// dead-lettered row (which the relay, reading it back, skips).
func (d *dispatcher) writeDeadLetter(ctx context.Context, tx pgx.Tx, dl deadRow) error {
	r := d.s.r
	var err error
	if dl.delKey != "" {
		_, err = tx.Exec(ctx, r.sql.DeadLetterRow, dl.delKey, dl.row.Attempts, dl.errText, dl.at)
	} else {
		key, text := pgsql.StoredID(dl.row.UUID)
		var pkey any
		if dl.row.PartitionKey != "" {
			pkey = dl.row.PartitionKey
		}
		metadata := string(dl.row.Metadata)
		if metadata == "" {
			metadata = "{}"
		}
		payload := dl.row.Payload
		if payload == nil {
			payload = []byte{}
		}
		_, err = tx.Exec(ctx, r.sql.DeadLetterEvent, key, text, dl.row.Topic, pkey, payload, metadata, dl.row.CreatedAt, dl.row.Attempts, dl.errText, dl.at)
	}
	if err != nil {
		return fmt.Errorf("dead-letter event %s: %w", dl.row.UUID, err)
	}
	return nil
}
