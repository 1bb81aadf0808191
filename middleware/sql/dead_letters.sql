-- Dead letters, oldest first: those waiting for a replay, or all with $9. Empty filters match all.
-- $1 consumer, $2 ids, $3 message ids, $4 topic, $5 reason contains, $6 from, $7 until, $8 limit.
SELECT id, consumer, topic, message_id, payload, metadata::text, reason, deliveries, dead_lettered_at
FROM {{schema}}.dead_letters
WHERE (replayed_at IS NULL OR $9)
  AND ($1 = '' OR consumer = $1)
  AND (cardinality($2::bigint[]) = 0 OR id = ANY($2::bigint[]))
  AND (cardinality($3::text[]) = 0 OR message_id = ANY($3::text[]))
  AND ($4 = '' OR topic = $4)
  AND ($5 = '' OR strpos(reason, $5) > 0)
  AND ($6::timestamptz IS NULL OR dead_lettered_at >= $6)
  AND ($7::timestamptz IS NULL OR dead_lettered_at < $7)
ORDER BY dead_lettered_at, id
LIMIT $8
