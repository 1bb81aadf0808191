-- $1 publication time, $2 seqs (rows this pass claimed: pending, found through the pending index).
UPDATE {{schema}}.outbox SET published_at = $1
WHERE seq = ANY($2::bigint[]) AND published_at IS NULL AND dead_lettered_at IS NULL
