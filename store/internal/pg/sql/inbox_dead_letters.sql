-- Consumers' dead letters, oldest first: those waiting for a replay, or all with $8. Empty filters
-- match all. $1 ids, $2 message ids, $3 consumer, $4 topic, $5 reason contains, $6 from, $7 until,
-- $8 include replayed, $9 limit.
SELECT id, consumer, topic, message_id, payload, metadata::text, reason, deliveries, dead_lettered_at, replayed_at
FROM {{schema}}.dead_letters
WHERE ((replayed_at IS NULL AND archived_at IS NULL) OR $8)
  AND (cardinality($1::bigint[]) = 0 OR id = ANY($1::bigint[]))
  AND (cardinality($2::text[]) = 0 OR message_id = ANY($2::text[]))
  AND ($3 = '' OR consumer = $3)
  AND ($4 = '' OR topic = $4)
  AND ($5 = '' OR strpos(reason, $5) > 0)
  AND ($6::timestamptz IS NULL OR dead_lettered_at >= $6)
  AND ($7::timestamptz IS NULL OR dead_lettered_at < $7)
ORDER BY dead_lettered_at, id
LIMIT $9
