-- The relay group's checkpoint (a confirmed position of 0/0: a backfill was begun and not finished).
-- $1 the relay group's name.
SELECT mode, confirmed_lsn::text FROM {{schema}}.log_relays WHERE name = $1
