-- Dead-lettered outbox rows, oldest first. Empty filters match all.
-- $1 seqs, $2 uuids, $3 topic, $4 partition key, $5 error contains, $6 from, $7 until, $8 limit.
SELECT seq, coalesce(uuid_text, uuid::text), topic, coalesce(partition_key, ''), payload, metadata, attempts,
       coalesce(last_error, ''), created_at, dead_lettered_at
FROM {{schema}}.outbox
WHERE {{dead_letter_filter}}
ORDER BY dead_lettered_at, seq
LIMIT $8
