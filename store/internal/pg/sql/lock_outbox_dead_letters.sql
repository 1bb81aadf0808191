-- The dead-lettered outbox rows a replay puts back, locked. Filters as outbox_dead_letters.sql.
SELECT seq, coalesce(uuid_text, uuid::text), topic, coalesce(partition_key, ''), payload, metadata, attempts,
       coalesce(last_error, ''), created_at, dead_lettered_at
FROM {{schema}}.outbox
WHERE {{dead_letter_filter}}
ORDER BY dead_lettered_at, seq
FOR UPDATE
