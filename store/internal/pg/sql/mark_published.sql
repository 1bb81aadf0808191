-- $1 publication time, $2 seqs.
UPDATE {{schema}}.outbox SET published_at = $1 WHERE seq = ANY($2::bigint[])
