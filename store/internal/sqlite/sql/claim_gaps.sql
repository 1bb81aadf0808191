-- Per key of the window, its first unpublished row outside the window: a row another relay holds,
-- one that must wait, or one published by a pass not yet committed. The window's rows of the key
-- after it would overtake it. ?1 the window's keys, ?2 the window's seqs, ?3 park (0/1).
SELECT partition_key, MIN(seq)
FROM {{schema}}.outbox
WHERE partition_key IN (?1)
  AND published_at IS NULL
  AND (dead_lettered_at IS NULL OR (?3 AND archived_at IS NULL))
  AND seq NOT IN (?2)
GROUP BY partition_key
