-- Dead-lettered outbox rows, oldest first. Filters: dead_letter_filter.sql; ?8 limit.
SELECT seq, uuid, topic, COALESCE(partition_key, ''), payload, metadata, attempts,
       COALESCE(last_error, ''), created_at, dead_lettered_at
FROM {{schema}}.outbox
WHERE {{dead_letter_filter}}
ORDER BY dead_lettered_at, seq
LIMIT ?8
