-- Sets the relay group's checkpoint, slot and mode (a position of 0/0: a backfill is to be done).
-- $1 the relay group's name, $2 its slot, $3 its mode, $4 the position.
INSERT INTO {{schema}}.log_relays (name, slot_name, mode, confirmed_lsn) VALUES ($1, $2, $3, $4::text::pg_lsn)
ON CONFLICT (name) DO UPDATE SET slot_name = excluded.slot_name, mode = excluded.mode, confirmed_lsn = excluded.confirmed_lsn, updated_at = now()
