-- Put dead-lettered rows back in line with a fresh attempt budget; a failure after this is grouped
-- anew. Archived rows are never replayed. $1 seqs.
UPDATE {{schema}}.outbox
SET dead_lettered_at = NULL,
    attempts         = 0,
    next_attempt_at  = NULL,
    failure_group    = NULL
WHERE seq = ANY($1::bigint[])
  AND dead_lettered_at IS NOT NULL
  AND published_at IS NULL
  AND archived_at IS NULL
