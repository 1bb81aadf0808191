package pglog

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/internal/walmsg"
	"github.com/outboxkit/outboxkit/store"
)

// decoder turns pgoutput's messages into outbox rows.
type decoder struct {
	r      *Relay
	prefix string
	// A message's Seq is its transaction's commit position shifted left 16 bits plus its index in
	// the transaction: unique and increasing in commit order (commits are at least 24 bytes of WAL
	// apart), and far above any outbox row's seq.
	finalLSN   pglogrepl.LSN
	idx        int64
	relations  map[uint32]*pglogrepl.RelationMessage
	types      *pgtype.Map
	commitTime time.Time
	xid        uint32 // the transaction's id
}

func newDecoder(r *Relay) *decoder {
	return &decoder{r: r, prefix: walmsg.Prefix(r.schema), relations: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}
}

func (d *decoder) begin(m *pglogrepl.BeginMessage) {
	d.commitTime, d.finalLSN, d.idx, d.xid = m.CommitTime, m.FinalLSN, 0, m.Xid
}

// insert decodes an INSERT into the outbox; ok is false for other tables and for rows that are
// not events to publish (dead letters written as such).
func (d *decoder) insert(m *pglogrepl.InsertMessage) (it item, ok bool, err error) {
	rel := d.relations[m.RelationID]
	if rel == nil {
		return it, false, fmt.Errorf("insert into relation %d before its description", m.RelationID)
	}
	if rel.Namespace != d.r.schema || rel.RelationName != "outbox" {
		return it, false, nil
	}
	var uuidText, uuidKey *string
	row := store.OutboxRow{CreatedAt: d.commitTime}
	for i, c := range rel.Columns {
		if i >= len(m.Tuple.Columns) {
			break
		}
		v := m.Tuple.Columns[i]
		if v.DataType == pglogrepl.TupleDataTypeNull {
			continue
		}
		if v.DataType != pglogrepl.TupleDataTypeText {
			return it, false, fmt.Errorf("outbox column %s: unexpected tuple data type %q", c.Name, v.DataType)
		}
		text := string(v.Data)
		switch c.Name {
		case "uuid":
			uuidKey = &text
		case "uuid_text":
			uuidText = &text
		case "seq":
			if row.Seq, err = strconv.ParseInt(text, 10, 64); err != nil {
				return it, false, fmt.Errorf("outbox column seq: %w", err)
			}
		case "topic":
			row.Topic = text
		case "partition_key":
			row.PartitionKey = text
		case "payload":
			if len(text) < 2 || text[:2] != `\x` {
				return it, false, errors.New(`outbox column payload: bytea not in hex format`)
			}
			if row.Payload, err = hex.DecodeString(text[2:]); err != nil {
				return it, false, fmt.Errorf("outbox column payload: %w", err)
			}
		case "metadata":
			row.Metadata = bytes.Clone(v.Data) // v.Data is the connection's buffer, read again
		case "created_at":
			var t time.Time
			if err := d.types.Scan(c.DataType, pgtype.TextFormatCode, v.Data, &t); err != nil {
				return it, false, fmt.Errorf("outbox column created_at: %w", err)
			}
			row.CreatedAt = t
		case "dead_lettered_at", "published_at":
			return it, false, nil // written as a dead letter, or as published: nothing to relay
		case "last_error":
			it.replayed = true
		}
	}
	if uuidKey == nil || row.Topic == "" {
		return it, false, errors.New("an outbox row without uuid or topic: is the outbox at this build's schema version?")
	}
	row.UUID = *uuidKey
	if uuidText != nil {
		row.UUID = *uuidText
	}
	return item{row: row, delKey: *uuidKey, xid: d.xid, commit: d.finalLSN, replayed: it.replayed}, true, nil
}

// message decodes a logical decoding message: ok is false for other prefixes. One with the
// outbox's prefix that does not decode is handed on as such, to be dead-lettered.
func (d *decoder) message(m *pglogrepl.LogicalDecodingMessage) (it item, ok bool) {
	if m.Prefix != d.prefix || d.r.cfg.Mode != ModeWAL {
		return it, false
	}
	d.idx++
	seq := int64(d.finalLSN)<<16 + d.idx
	content := bytes.Clone(m.Content) // m.Content is the connection's buffer, read again
	e, err := walmsg.Decode(content)
	if err != nil {
		return item{row: store.OutboxRow{Seq: seq, Payload: content, CreatedAt: d.commitTime}, bad: err, lsn: m.LSN}, true
	}
	return item{row: store.OutboxRow{Seq: seq, UUID: e.UUID, Topic: e.Topic, PartitionKey: e.PartitionKey,
		Payload: e.Payload, Metadata: e.Metadata, CreatedAt: d.commitTime}, lsn: m.LSN, commit: d.finalLSN}, true
}
