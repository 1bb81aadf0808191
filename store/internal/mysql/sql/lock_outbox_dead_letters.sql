-- The dead-lettered outbox rows a replay puts back, locked. Filters: dead_letter_filter.sql.
SELECT seq, uuid, topic, COALESCE(partition_key, ''), payload, metadata, attempts,
       COALESCE(last_error, ''), created_at, dead_lettered_at
FROM {{schema}}.outbox
WHERE {{dead_letter_filter}}
ORDER BY dead_lettered_at, seq
FOR UPDATE
