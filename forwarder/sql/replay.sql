-- Put dead-lettered rows back in line with a fresh attempt budget. Empty filters match all.
-- $1 seqs, $2 uuids, $3 topic, $4 partition key.
UPDATE {{schema}}.outbox
SET dead_lettered_at = NULL,
    attempts         = 0,
    next_attempt_at  = NULL
WHERE dead_lettered_at IS NOT NULL
  AND published_at IS NULL
  AND (cardinality($1::bigint[]) = 0 OR seq = ANY($1::bigint[]))
  AND (cardinality($2::text[]) = 0 OR uuid = ANY($2::text[]))
  AND ($3::text = '' OR topic = $3::text)
  AND ($4::text = '' OR partition_key = $4::text)
RETURNING seq
