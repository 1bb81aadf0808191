-- The relay group's slot as the server keeps it.
-- $1 the slot's name.
SELECT coalesce(plugin, ''), slot_type, coalesce(database::text, ''), coalesce(wal_status, ''),
    confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1
