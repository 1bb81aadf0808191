-- Lock the chosen rows (the heads are already ours) and read what publishing needs.
-- $1 the chosen seqs.
SELECT seq, uuid, topic, partition_key, payload, metadata::text, created_at, attempts
FROM {{schema}}.outbox
WHERE seq = ANY($1::bigint[])
  AND published_at IS NULL
  AND dead_lettered_at IS NULL
ORDER BY seq
FOR UPDATE
