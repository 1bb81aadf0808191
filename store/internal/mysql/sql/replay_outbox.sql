-- Put dead-lettered rows back in line with a fresh attempt budget. ?1 seqs.
UPDATE {{schema}}.outbox
SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = NULL, failure_group = NULL
WHERE seq IN (?1) AND dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL
