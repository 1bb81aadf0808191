package pglog

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/pgsql"
)

// readSlots reads the relay groups of the outbox's log_relays and their slots with q (the
// Slots statement rendered for its schema): name one group, or nil for all.
func readSlots(ctx context.Context, pool *pgxpool.Pool, q string, name *string) ([]forwarder.SlotStatus, error) {
	rows, err := pool.Query(ctx, q, name)
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
	return readSlots(ctx, pool, pgsql.NewLogRelay(schema).Slots, nil)
}

// SlotStatus reads the relay's slot as the server sees it, with the relay's parked keys and held events
// (prom.NewSlotCollector exports it at each scrape). Before the relay first ran, it reports the
// slot as missing. One statement.
func (r *Relay) SlotStatus(ctx context.Context) (forwarder.SlotStatus, error) {
	name := r.fcfg.Name
	slots, err := readSlots(ctx, r.cfg.Pool, r.sql.Slots, &name)
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
