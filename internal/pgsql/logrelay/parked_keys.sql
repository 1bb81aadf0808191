-- The keys with a dead letter, or with a replayed one not yet published (its rows may have been
-- read back by a session that stopped before they all went), each with the seq of its earliest
-- dead letter not archived (0: none parks it).
-- $1 the keys to read, or NULL for all.
SELECT partition_key, coalesce(min(seq) FILTER (WHERE dead_lettered_at IS NOT NULL AND archived_at IS NULL), 0)
FROM {{schema}}.outbox WHERE (dead_lettered_at IS NOT NULL OR last_error IS NOT NULL) AND published_at IS NULL AND partition_key IS NOT NULL
AND ($1::text[] IS NULL OR partition_key = ANY($1)) GROUP BY partition_key
