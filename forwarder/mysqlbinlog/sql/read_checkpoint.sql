-- The relay group's checkpoint. ?1 its name.
SELECT flavor, progress, gtid_set, file, pos, backfilled FROM {{schema}}.binlog_relays WHERE name = ?
