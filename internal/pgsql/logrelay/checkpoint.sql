-- One checkpoint: removes the published rows and records the confirmable position, in one
-- statement; returns how many rows it removed.
-- $1 the published rows' uuids, $2 the relay group's name, $3 its slot, $4 its mode, $5 the position.
WITH removed AS (DELETE FROM {{schema}}.outbox WHERE uuid = ANY($1::uuid[]) AND dead_lettered_at IS NULL RETURNING 1),
saved AS (INSERT INTO {{schema}}.log_relays AS c (name, slot_name, mode, confirmed_lsn) VALUES ($2, $3, $4, $5::text::pg_lsn)
ON CONFLICT (name) DO UPDATE SET confirmed_lsn = GREATEST(c.confirmed_lsn, excluded.confirmed_lsn), mode = excluded.mode, updated_at = now())
SELECT count(*) FROM removed
