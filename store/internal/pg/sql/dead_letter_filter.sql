-- The dead-letter selection shared by listing and replay. Empty filters match all.
-- $1 seqs, $2 uuids, $3 topic, $4 partition key, $5 error contains, $6 from, $7 until.
dead_lettered_at IS NOT NULL
AND published_at IS NULL
AND archived_at IS NULL
AND (cardinality($1::bigint[]) = 0 OR seq = ANY($1::bigint[]))
AND (cardinality($2::text[]) = 0 OR coalesce(uuid_text, uuid::text) = ANY($2::text[]))
AND ($3::text = '' OR topic = $3::text)
AND ($4::text = '' OR partition_key = $4::text)
AND ($5::text = '' OR strpos(last_error, $5::text) > 0)
AND ($6::timestamptz IS NULL OR dead_lettered_at >= $6::timestamptz)
AND ($7::timestamptz IS NULL OR dead_lettered_at < $7::timestamptz)
