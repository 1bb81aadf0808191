-- The relay groups that have run on the outbox, with their slots as the server keeps them and
-- whether an operator pauses them.
-- $1 a relay group's name, or NULL for all.
SELECT c.name, c.slot_name, c.mode, s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
    coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0), coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0),
    coalesce(s.safe_wal_size, -1), coalesce(s.confirmed_flush_lsn::text, ''),
    EXISTS (SELECT 1 FROM {{schema}}.pauses p WHERE p.scope = 'relay' AND p.name = c.name)
FROM {{schema}}.log_relays c LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot_name AND s.database = current_database()
WHERE $1::text IS NULL OR c.name = $1 ORDER BY c.name
