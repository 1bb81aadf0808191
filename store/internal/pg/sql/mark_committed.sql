-- A transactional relay's recovery: rows its broker transaction committed. $1 publication time,
-- $2 seqs. Only pending rows: marking twice changes nothing.
UPDATE {{schema}}.outbox SET published_at = $1
WHERE seq = ANY($2::bigint[]) AND published_at IS NULL AND dead_lettered_at IS NULL
