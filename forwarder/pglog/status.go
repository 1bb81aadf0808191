package pglog

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
)

// slotQuery reads the relay groups of a schema's log_relays and their slots; $1 a group's name,
// or NULL for all.
const slotQuery = `SELECT c.name, c.slot_name, c.mode, s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
	coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0), coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0),
	coalesce(s.safe_wal_size, -1), coalesce(s.confirmed_flush_lsn::text, ''),
	EXISTS (SELECT 1 FROM %s p WHERE p.scope = 'relay' AND p.name = c.name)
	FROM %s c LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot_name AND s.database = current_database()
	WHERE $1::text IS NULL OR c.name = $1 ORDER BY c.name`

func readSlots(ctx context.Context, pool *pgxpool.Pool, schema string, name *string) ([]forwarder.SlotStatus, error) {
	rows, err := pool.Query(ctx, fmt.Sprintf(slotQuery, pgx.Identifier{schema, "pauses"}.Sanitize(), pgx.Identifier{schema, "log_relays"}.Sanitize()), name)
	if err != nil {
		return nil, fmt.Errorf("read the log relays' slots: %w", err)
	}
	defer rows.Close()
	var out []forwarder.SlotStatus
	for rows.Next() {
		var s forwarder.SlotStatus
		if err := rows.Scan(&s.Relay, &s.Slot, &s.Mode, &s.Exists, &s.Active, &s.WALStatus, &s.LagBytes, &s.RetainedBytes,
			&s.SafeWALBytes, &s.ConfirmedLSN, &s.Paused); err != nil {
			return nil, fmt.Errorf("read the log relays' slots: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the log relays' slots: %w", err)
	}
	return out, nil
}

// ReadSlots reads the slot of every log relay group that has run on the outbox in schema — for an
// operator's tool (outboxctl status) that runs no relay. One statement.
func ReadSlots(ctx context.Context, pool *pgxpool.Pool, schema string) ([]forwarder.SlotStatus, error) {
	return readSlots(ctx, pool, schema, nil)
}

// SlotStatus reads the relay's slot as the server sees it, with the relay's parked keys and held events
// (prom.NewSlotCollector exports it at each scrape). Before the relay first ran, it reports the
// slot as missing. One statement.
func (r *Relay) SlotStatus(ctx context.Context) (forwarder.SlotStatus, error) {
	name := r.fcfg.Name
	slots, err := readSlots(ctx, r.cfg.Pool, r.schema, &name)
	if err != nil {
		return forwarder.SlotStatus{}, err
	}
	s := forwarder.SlotStatus{Relay: name, Slot: r.cfg.SlotName, Mode: string(r.cfg.Mode), SafeWALBytes: -1}
	if len(slots) > 0 {
		s = slots[0]
	}
	s.ParkedKeys = int(r.parked.Load())
	s.HeldEvents = int(r.held.Load())
	return s, nil
}
